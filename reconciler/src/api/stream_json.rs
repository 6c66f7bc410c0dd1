//! A JSON response body written as it is sent, for documents too large to build whole.
//!
//! `GET /state` on a large fleet (50,000 GPUs, tens of thousands of running workloads) is tens
//! of MB of JSON; `Json` would serialize all of it into one buffer per request. Here the
//! serializer runs on a blocking thread and writes into a [`ChunkWriter`], which cuts its output
//! into [`CHUNK_BYTES`] pieces and sends each into a channel of [`CHANNEL_CHUNKS`]: memory stays
//! bounded by the channel whatever the document's size, and a slow client holds the serializer
//! back. When the client goes away the channel closes, the next write fails, and serialization
//! stops there. The bytes are exactly those of `serde_json::to_vec`.

use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use tokio::sync::mpsc;

/// The size of every chunk but the last.
pub(super) const CHUNK_BYTES: usize = 64 * 1024;

/// Chunks written ahead of the client, at most.
const CHANNEL_CHUNKS: usize = 4;

type Chunk = io::Result<Bytes>;

/// A response body of the JSON that `write` writes (e.g. with `serde_json::to_writer`), produced
/// on a blocking thread while it is sent. A failure mid-document (not the client going away) is
/// logged and ends the body with an error, so the client sees a cut-off response, not a short
/// document.
pub(super) fn body<F>(write: F) -> Body
where
    F: FnOnce(&mut ChunkWriter) -> serde_json::Result<()> + Send + 'static,
{
    Body::from_stream(spawn(write))
}

/// Runs `write` on a blocking thread; its output arrives as [`Chunks`].
fn spawn<F>(write: F) -> Chunks
where
    F: FnOnce(&mut ChunkWriter) -> serde_json::Result<()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let mut writer = ChunkWriter::new(tx, CHUNK_BYTES);
        let result = write(&mut writer)
            .map_err(io::Error::from)
            .and_then(|()| writer.flush());
        if let Err(error) = result {
            if writer.tx.is_closed() {
                tracing::debug!(%error, "JSON response abandoned: the client went away");
            } else {
                tracing::warn!(%error, "JSON response cut short: serialization failed");
                // Nothing to do if the client left meanwhile.
                let _ = writer.tx.blocking_send(Err(error));
            }
        }
    });
    Chunks(rx)
}

/// An [`io::Write`] that sends what it is given, `chunk` bytes at a time, into a bounded
/// channel, waiting while the channel is full. Not for async contexts (it blocks).
pub(super) struct ChunkWriter {
    buf: Vec<u8>,
    chunk: usize,
    tx: mpsc::Sender<Chunk>,
}

impl ChunkWriter {
    fn new(tx: mpsc::Sender<Chunk>, chunk: usize) -> ChunkWriter {
        ChunkWriter {
            buf: Vec::with_capacity(chunk),
            chunk,
            tx,
        }
    }

    /// Sends what is buffered; an error once the receiver is gone.
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(self.chunk));
        self.tx
            .blocking_send(Ok(Bytes::from(full)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let taken = data.len().min(self.chunk - self.buf.len());
        self.buf.extend_from_slice(&data[..taken]);
        if self.buf.len() == self.chunk {
            self.send()?;
        }
        Ok(taken)
    }

    /// Sends the partial chunk, if any.
    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// The receiving end, as a stream for [`Body::from_stream`]; dropping it stops the writer.
struct Chunks(mpsc::Receiver<Chunk>);

impl futures_core::Stream for Chunks {
    type Item = Chunk;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        self.get_mut().0.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    /// Several chunks' worth of JSON, with strings that need escaping.
    fn large() -> serde_json::Value {
        let items: Vec<_> = (0..20_000)
            .map(|i| json!({"name": format!("w-{i}"), "note": "a \"quoted\"\n line", "n": i}))
            .collect();
        json!({"apiVersion": "v1", "items": items})
    }

    #[tokio::test]
    async fn the_chunks_are_the_document() {
        let value = large();
        let expected = serde_json::to_vec(&value).unwrap();
        assert!(expected.len() > 5 * CHUNK_BYTES);
        let Chunks(mut rx) = spawn(move |w| serde_json::to_writer(w, &value));
        let mut chunks = Vec::new();
        while let Some(chunk) = rx.recv().await {
            chunks.push(chunk.unwrap());
        }
        let (last, full) = chunks.split_last().unwrap();
        assert!(full.iter().all(|c| c.len() == CHUNK_BYTES));
        assert!(!last.is_empty() && last.len() <= CHUNK_BYTES);
        assert_eq!(chunks.concat(), expected);
    }

    #[test]
    fn a_dropped_receiver_is_a_write_error() {
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        drop(rx);
        let mut writer = ChunkWriter::new(tx, 16);
        let error = serde_json::to_writer(&mut writer, &large()).unwrap_err();
        assert!(error.is_io(), "{error}");
    }

    /// The client reads one chunk and leaves: the serializer, in the middle of an endless
    /// document, stops with an error instead of running on.
    #[tokio::test]
    async fn serialization_stops_when_the_client_goes_away() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let Chunks(mut rx) = spawn(move |w| {
            let result = serde_json::to_writer(w, &Endless);
            done_tx.send(result.is_err()).unwrap();
            result
        });
        assert_eq!(rx.recv().await.unwrap().unwrap().len(), CHUNK_BYTES);
        drop(rx);
        let stopped =
            tokio::task::spawn_blocking(move || done_rx.recv_timeout(Duration::from_secs(30)))
                .await
                .unwrap();
        assert_eq!(stopped, Ok(true));
    }

    /// A JSON array with no end.
    struct Endless;

    impl serde::Serialize for Endless {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_seq(0u64..)
        }
    }
}
