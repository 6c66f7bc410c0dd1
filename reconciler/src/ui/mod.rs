//! The fleet page (`GET /ui`): a read-only, server-rendered HTML page with inline SVG, no
//! JavaScript.
//!
//! - [`model`]: the page's data ([`FleetPage`]), built from the service's state as one viewer
//!   may see it (the operator everything; a tenant its own workloads and its subtree's usage).
//! - [`render`]: pure functions from that data to HTML; everything from the repository or a
//!   tenant is escaped ([`html`]).
//! - [`sessions`]: browser sessions (a cookie holding a random id) and one-time login codes,
//!   since a browser cannot send the API's bearer header.
//!
//! The routes are in `api/ui.rs`.

pub mod html;
pub mod model;
pub mod render;
pub mod sessions;

#[cfg(test)]
mod tests;

pub use model::{FleetPage, Sources};
pub use sessions::Sessions;
