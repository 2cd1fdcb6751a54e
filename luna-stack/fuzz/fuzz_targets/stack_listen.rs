//! Frames injected into a listening stack (port 80, backlog 4, SYN cookies beyond it):
//! raw frames, SYN bursts and TCP segments with valid checksums that follow the connections
//! they create. Asserts no panic, poll_transmit runs dry, and connection count and queue
//! lengths stay within their configured bounds (see stack_harness.rs).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "stack_harness.rs"]
mod stack_harness;

fuzz_target!(|data: &[u8]| {
    stack_harness::Harness::listening().run(data);
});
