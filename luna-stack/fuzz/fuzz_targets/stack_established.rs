//! Frames injected into an established connection: a scripted peer completes the handshake
//! (window scaling, SACK, timestamps) with 20 kB in flight from the stack, then the fuzz
//! input drives TCP segments on the live 4-tuple with sequence and ACK numbers near the
//! live window, SACK blocks, timestamps, raw frames, timer advances and application calls.
//! Asserts no panic and bounded memory (see stack_harness.rs).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "stack_harness.rs"]
mod stack_harness;

fuzz_target!(|data: &[u8]| {
    stack_harness::Harness::established().run(data);
});
