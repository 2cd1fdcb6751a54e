//! The NIC-less testbed: namespaces, veth/tap/memif topologies and netem impairments.
#![forbid(unsafe_code)]
