//! Returning the guard itself.
use stdx::scoped::ScopedLock;

async fn io() {}

async fn f(lock: &ScopedLock<u32>) {
    let held = lock.with(|held| held).await;
    io().await;
    drop(held);
}

fn main() {
    drop(f(&ScopedLock::new(0)));
}
