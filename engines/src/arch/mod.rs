//! The bundled engines, one folder each.

pub mod inkling;
