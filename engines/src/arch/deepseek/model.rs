//! DeepSeek's config and weights (modelled on the DeepSeek V4 engine): GQA attention over a sliding window of raw
//! k/v rows, a per-layer compressor that pools every `ratio` positions into one compressed row, and a MoE FFN.
//!
//! Layers alternate compression ratios as V4 does: even layers use `compress_ratio` (4 in every preset, with
//! overlapping blocks: 2·ratio state rows, each position contributing two halves), odd layers `4 · compress_ratio`
//! without overlap.

use serde::{Deserialize, Serialize};

use crate::arch::checkpoint_layout::Stack;
use crate::arch::cost;
use crate::arch::qk_norm_attn::QkNormProj;
use crate::config::{check_positive, preset_window, ArchConfig, BaseConfig, Preset};
use crate::error::Result;
use crate::fixture::Init;
use crate::kernels::Rope;
use crate::model_cost::{ModelCost, Reach};
use crate::tensors::Source;

/// DeepSeek's config: the shared base plus its options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: BaseConfig,
    /// Rows of raw k/v each layer's ring keeps.
    pub window: usize,
    /// Positions per compressed row on even layers (4 times as many on odd ones).
    pub compress_ratio: usize,
}

crate::derefs_to_base!(Config);

impl ArchConfig for Config {
    /// Every layer is window + compressor, ratio 4 (and 16 on odd layers).
    fn preset(p: Preset) -> Self {
        Config { base: BaseConfig::preset("deepseek", p), window: preset_window(p), compress_ratio: 4 }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        check_positive(
            "deepseek",
            &[
                ("window", self.window, "the sliding window"),
                ("compress_ratio", self.compress_ratio, "the compression"),
            ],
        )
    }

    /// Every layer: GQA projections, the compressor's two projections, the MoE; attention over the window of raw
    /// rows plus the layer's compressed rows.
    fn cost(&self) -> ModelCost {
        let mut m = ModelCost::default();
        let kvd = self.kv_heads * self.head_dim;
        for l in 0..self.layers {
            let coff = 1 + usize::from(layer_overlap(self, l));
            m.token_flops += cost::gqa_proj(self) + 2 * cost::matmul(self.hidden, coff * kvd) + cost::moe(self);
            m.attend(Reach::Window(self.window), cost::gqa_key(self));
            m.attend(Reach::Compressed(layer_ratio(self, l)), cost::gqa_key(self));
        }
        m
    }
}

/// The compressor of one layer: per position a kv row and a score row (`coff · width` wide, coff = 2 with overlap),
/// plus a learned per-slot bias (`ape`) on the scores.
#[derive(Debug, Clone)]
pub struct Compressor {
    pub ratio: usize,
    pub overlap: bool,
    /// Width of one compressed row (= kv_heads · head_dim).
    pub width: usize,
    /// `[coff · width, hidden]`.
    pub wkv: Vec<f32>,
    pub wgate: Vec<f32>,
    /// `[ratio, coff · width]`: added to the score of the position at slot `pos % ratio`.
    pub ape: Vec<f32>,
    /// RMS norm of the pooled row, `[width]`.
    pub norm: Vec<f32>,
}

impl Compressor {
    /// 2 with overlap (each position feeds this block and the next), else 1.
    pub fn coff(&self) -> usize {
        1 + usize::from(self.overlap)
    }
}

/// A layer's attention: the q/k-normed GQA projections, then the compressor.
#[derive(Debug, Clone)]
pub struct Attention {
    pub proj: QkNormProj,
    pub comp: Compressor,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: Config,
    pub stack: Stack<Attention>,
    pub rope: Rope,
    /// Short hash of config + weights.
    pub hash: String,
}

/// The compression ratio of layer `l`.
pub fn layer_ratio(c: &Config, l: usize) -> usize {
    if l.is_multiple_of(2) {
        c.compress_ratio
    } else {
        c.compress_ratio * 4
    }
}

/// V4 overlaps blocks on its ratio-4 layers only.
pub fn layer_overlap(c: &Config, l: usize) -> bool {
    layer_ratio(c, l) == 4
}

impl Model {
    /// The model from `src`, every tensor named once, in checkpoint order.
    pub fn build(c: Config, src: &mut dyn Source, hash: String) -> Result<Model> {
        let (h, hd) = (c.hidden, c.head_dim);
        let kvd = c.kv_heads * hd;
        let stack = Stack::build(src, &c, |t, i| {
            let (ratio, overlap) = (layer_ratio(&c, i), layer_overlap(&c, i));
            let coff = 1 + usize::from(overlap);
            Ok(Attention {
                proj: QkNormProj::load(t, &c)?,
                comp: Compressor {
                    ratio,
                    overlap,
                    width: kvd,
                    wkv: t.linear("self_attn.compressor.wkv.weight", coff * kvd, h)?,
                    wgate: t.linear("self_attn.compressor.wgate.weight", coff * kvd, h)?,
                    ape: t.take("self_attn.compressor.ape", &[ratio, coff * kvd], Init::Uniform(0.5))?,
                    norm: t.norm("self_attn.compressor.norm.weight", kvd)?,
                },
            })
        })?;
        Ok(Model { stack, rope: Rope::new(hd, c.rope_theta), hash, config: c })
    }
}
