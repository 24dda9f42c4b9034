//! The scoped lock's compile-time guarantee (`stdx::scoped`): holding it across an await does
//! not compile, whichever way the guard is taken out of the closure, each case pinned to the
//! error it expects (`tests/scoped_lock/*.stderr`); the same code without the guard held across
//! the await compiles (`pass_*.rs`), so the cases fail for that alone.
//!
//! The `.stderr` files are rustc's words: a new toolchain that words an error differently fails
//! here, and `TRYBUILD=overwrite cargo test -p stdx --test scoped_lock` writes them again, for
//! review.

#[test]
fn holding_the_lock_across_an_await_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/scoped_lock/fail_*.rs");
    cases.pass("tests/scoped_lock/pass_*.rs");
}
