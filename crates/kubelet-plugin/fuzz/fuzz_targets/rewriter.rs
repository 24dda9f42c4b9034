//! Fuzz target: a client's byte stream through the `:authority` rewriter in front of the kubelet
//! servers. Never a panic; the same output and verdict however the stream is cut; an accepted
//! stream reaches the server as sent, but for `:authority` values the server would refuse.
//!
//! Input: one byte choosing the read size and whether the HTTP/2 client preface is put in front,
//! then the client's bytes (see `kubelet_plugin::fuzzing::rewriter`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kubelet_plugin::fuzzing::rewriter(data));
