//! Stub tests (filled below).
