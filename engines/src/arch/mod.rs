//! The bundled engines, one folder each, and the pieces they share (one concept per file).

pub mod deepseek;
pub mod glm;
pub mod glm53;
pub mod inkling;
pub mod kimi;
pub mod llama;

mod checkpoint_layout;
pub mod cost;
pub(crate) mod gqa_attend;
mod gqa_dims;
mod gqa_proj;
pub(crate) mod model_hash;
mod moe_sublayer;
mod output_head;
mod qk_norm_attn;
mod short_conv;
