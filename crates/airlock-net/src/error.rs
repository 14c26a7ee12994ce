//! Why a proxy could not start.

use std::io;

/// The proxy could not start. Once started, it never fails as a whole: each
/// connection's trouble is in that connection's record.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("the proxy's listening socket cannot be used: {0}")]
    Listener(#[source] io::Error),
    #[error("the proxy could not start its thread: {0}")]
    Thread(#[source] io::Error),
}
