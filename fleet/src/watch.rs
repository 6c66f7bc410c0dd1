//! Reading a watch: the one place that tells an answer from the end of a watch.

use etcd_client::{WatchResponse, WatchStream};

use crate::error::{FleetError, etcd};

/// The watch's next answer; `None` when etcd ended or cancelled the watch (the caller starts a
/// new one, which begins with a full read). `prefix` names what is watched, for the error.
pub(crate) async fn next_answer(
    stream: &mut WatchStream,
    prefix: &str,
) -> Result<Option<WatchResponse>, FleetError> {
    match stream
        .message()
        .await
        .map_err(|e| etcd("watch", prefix, e))?
    {
        Some(answer) if !answer.canceled() => Ok(Some(answer)),
        _ => Ok(None),
    }
}
