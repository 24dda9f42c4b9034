//! Keeping the guard outside the closure, in a captured variable.
use stdx::scoped::ScopedLock;

async fn io() {}

async fn f(lock: &ScopedLock<u32>) {
    let mut kept = None;
    lock.with(|held| kept = Some(held)).await;
    io().await;
    drop(kept);
}

fn main() {
    drop(f(&ScopedLock::new(0)));
}
