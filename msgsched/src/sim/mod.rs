//! Discrete-event simulator of the CP / CS / MS queueing models (not written yet).
