//! Awaiting IO with the lock held: the closure is not async.
use stdx::scoped::ScopedLock;

async fn io() {}

async fn f(lock: &ScopedLock<u32>) {
    lock.with(|_held| io().await).await;
}

fn main() {
    drop(f(&ScopedLock::new(0)));
}
