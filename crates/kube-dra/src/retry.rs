//! Per-attempt timeouts and retries with a total budget, for calls made on the kubelet's behalf.
//!
//! The kubelet gives a prepare call 45 seconds. A claim read must answer well inside that, so
//! every attempt has its own timeout and all attempts together have a budget; transient failures
//! (timeouts, connection errors, 429 and 5xx answers) are retried with exponential backoff while
//! the budget lasts, everything else is final at once.

use std::time::Duration;

use tokio::time::Instant;

use super::version::{DiscoveryError, ResourceApiVersion};

/// How long one attempt may take, how long all may take, and how long to wait in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Timeout of one request.
    pub attempt_timeout: Duration,
    /// Time after which no new attempt starts.
    pub budget: Duration,
    /// Wait after the first failure; doubled after each further one.
    pub initial_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 10 s per attempt, 30 s in all: an answer (or a clear error) within the kubelet's 45 s.
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(10),
            budget: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// How one attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// No answer within the attempt timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API server answered with an error status.
    #[error("api server answered {code} {reason}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// The status reason (`Forbidden`, `NotFound`).
        reason: String,
        /// The status message.
        message: String,
    },
    /// The request failed on the way (connection, TLS, decoding).
    #[error("request failed")]
    Transport(#[source] ::kube::Error),
    /// The `resource.k8s.io` version could not be discovered.
    #[error(transparent)]
    Discovery(DiscoveryError),
    /// The version we used is no longer served; the next attempt discovers again.
    #[error("{0} is no longer served")]
    VersionGone(ResourceApiVersion),
}

impl AttemptError {
    /// Sorts a kube-rs error into an API answer or a transport failure.
    pub fn from_kube(error: ::kube::Error) -> Self {
        match error {
            ::kube::Error::Api(status) => Self::Api {
                code: status.code,
                reason: status.reason,
                message: status.message,
            },
            other => Self::Transport(other),
        }
    }

    /// Whether trying again may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::VersionGone(_) => true,
            Self::Api { code, .. } | Self::Discovery(DiscoveryError::Api { code, .. }) => {
                *code == 429 || *code >= 500
            }
            // A response we could not decode will not decode better next time; everything else
            // (connect, TLS, a dropped connection) may.
            Self::Transport(e) | Self::Discovery(DiscoveryError::Transport(e)) => {
                !matches!(e, ::kube::Error::SerdeError(_))
            }
            Self::Discovery(
                DiscoveryError::GroupNotServed | DiscoveryError::NoKnownVersion { .. },
            ) => false,
        }
    }
}

/// Why [`RetryPolicy::run`] gave up: the last attempt failed and no further one was possible
/// (the failure was not transient, or the budget was spent).
#[derive(Debug, thiserror::Error)]
#[error("{last} (after {attempts} attempts)")]
pub struct RetryError {
    /// Attempts made.
    pub attempts: u32,
    /// How the last one failed.
    pub last: AttemptError,
}

impl RetryPolicy {
    /// Runs `attempt` until it succeeds, fails with an error that is not transient, or the
    /// budget is spent.
    pub async fn run<T, F, Fut>(&self, mut attempt: F) -> Result<T, RetryError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, AttemptError>>,
    {
        let deadline = Instant::now() + self.budget;
        let mut backoff = self.initial_backoff;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last = match tokio::time::timeout(self.attempt_timeout, attempt()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) => error,
                Err(_) => AttemptError::Timeout(self.attempt_timeout),
            };
            let retry_at = Instant::now() + backoff;
            if !last.is_transient() || retry_at >= deadline {
                return Err(RetryError { attempts, last });
            }
            tracing::debug!(attempts, error = %last, "retrying kubernetes api request");
            tokio::time::sleep_until(retry_at).await;
            backoff = (backoff * 2).min(self.max_backoff);
        }
    }
}
