//! Fuzz target: arbitrary bytes as an HPACK header block and as a Huffman string. Decoding fails
//! cleanly or succeeds; what decodes survives re-encoding (see `kubelet_plugin::fuzzing::hpack`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kubelet_plugin::fuzzing::hpack(data));
