//! Returning a future that holds the guard, to await once the closure has returned.
use stdx::scoped::ScopedLock;

async fn io() {}

async fn f(lock: &ScopedLock<u32>) {
    let later = lock
        .with(|held| async move {
            let _held = held;
            io().await
        })
        .await;
    later.await;
}

fn main() {
    drop(f(&ScopedLock::new(0)));
}
