//! KV caches, one type per layer kind. Every row carries the absolute position it holds and its writer.

mod floats;
mod full;
mod head_major;
mod ring;
mod rows;

pub use floats::Floats;
pub use full::FullCache;
pub use head_major::HeadMajorCache;
pub use ring::RingCache;
pub use rows::{RowMeta, Rows};
