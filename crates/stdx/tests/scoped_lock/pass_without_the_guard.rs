//! The fail_*.rs cases without the guard held across the await: each compiles.
use stdx::scoped::ScopedLock;

async fn io() {}

async fn f(lock: &ScopedLock<u32>) {
    // A future made under the lock and awaited after it.
    lock.with(|_held| io()).await.await;
    // A future that does not hold the guard.
    let later = lock.with(|_held| async move { io().await }).await;
    later.await;
    // Something else kept outside.
    let mut kept = None;
    lock.with(|held| kept = Some(*held)).await;
    io().await;
    std::hint::black_box(kept);
    // A value read under the lock returned.
    let value = lock.with(|held| *held).await;
    io().await;
    std::hint::black_box(value);
}

fn main() {
    drop(f(&ScopedLock::new(0)));
}
