//! The bundled engines, one folder each.

pub mod deepseek;
pub mod glm;
pub mod glm53;
pub mod inkling;
pub mod kimi;
