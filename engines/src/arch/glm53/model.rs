//! glm53's config and weights: GQA attention whose rows are cached whole per position (full caches), a MoE FFN,
//! and a small MTP drafter (its own attention + dense FFN layers over the main model's embeddings and lm head).

use serde::{Deserialize, Serialize};

use crate::arch::checkpoint_layout::{expert, Stack};
use crate::arch::cost;
use crate::arch::gqa_proj::GqaProj;
use crate::config::{ArchConfig, BaseConfig, Preset};
use crate::error::Result;
use crate::kernels::Rope;
use crate::model_cost::{ModelCost, Reach};
use crate::moe::Expert;
use crate::tensors::{within, Source};

/// glm53's config: the shared base plus its options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: BaseConfig,
    /// The position-fixed prefill chunk grid (0: `prefill_chunk`).
    #[serde(default)]
    pub prompt_rows: usize,
    /// Layers of the speculative drafter (0: no drafter).
    #[serde(default)]
    pub draft_layers: usize,
    /// The prefix cache switch; off reproduces the cold path bit for bit.
    #[serde(default = "crate::config::on")]
    pub prefix_cache: bool,
}

crate::derefs_to_base!(Config);

impl ArchConfig for Config {
    /// One slot (seed 004 caches one conversation), a grid the prefill chunk follows, and a 1-layer drafter.
    fn preset(p: Preset) -> Self {
        let prompt_rows = match p {
            Preset::Tiny => 16,
            Preset::Small => 64,
            Preset::Bench => 128,
        };
        let base = BaseConfig { slots: 1, prefill_chunk: prompt_rows, ..BaseConfig::preset("glm53", p) };
        Config { base, prompt_rows, draft_layers: 1, prefix_cache: true }
    }

    /// The main stack (GQA and MoE, full attention) and, as prefill feeds the drafter too, its dense layers.
    fn cost(&self) -> ModelCost {
        let (main, draft) = (self.layers as u64, self.draft_layers as u64);
        let mut m = ModelCost {
            token_flops: main * (cost::gqa_proj(self) + cost::moe(self))
                + draft * (cost::gqa_proj(self) + cost::dense_ffn(self)),
            attention: Vec::new(),
        };
        m.attend(Reach::Full, (main + draft) * cost::gqa_key(self));
        m
    }
}

/// One drafter layer: GQA attention and a dense SiLU-gated FFN, each pre-normed (`[hidden]` norms).
#[derive(Debug, Clone)]
pub struct DraftLayer {
    pub attn_norm: Vec<f32>,
    pub attn: GqaProj,
    pub ffn_norm: Vec<f32>,
    /// Gate and up `[ffn, hidden]`, down `[hidden, ffn]`.
    pub ffn: Expert,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: Config,
    pub stack: Stack<GqaProj>,
    /// The MTP drafter's layers and final norm (`[hidden]`); it shares the embedding and the lm head.
    pub draft: Vec<DraftLayer>,
    pub draft_norm: Vec<f32>,
    pub rope: Rope,
    /// The position-fixed prefill grid (`prompt_rows`, or `prefill_chunk` when a config leaves it 0).
    pub grid: usize,
    /// Short hash of config + weights.
    pub hash: String,
}

impl Model {
    /// The model from `src`, every tensor named once, in checkpoint order (the drafter's `mtp.` tensors last).
    pub fn build(c: Config, src: &mut dyn Source, hash: String) -> Result<Model> {
        let h = c.hidden;
        let mut stack = Stack::build(src, &c, |t, _| GqaProj::load(t, &c))?;
        // prefill reduces `Tiled` and a short chunk gives each expert a few rows: their tails read a copy built here
        // instead of transposing the expert's weights on every call
        stack.layers.iter_mut().for_each(|layer| _ = layer.moe.add_tail_blocks());
        let mut draft = Vec::with_capacity(c.draft_layers);
        for i in 0..c.draft_layers {
            let t = &mut within(src, format!("mtp.layers.{i}."));
            let attn_norm = t.norm("input_layernorm.weight", h)?;
            let attn = GqaProj::load(t, &c)?;
            let ffn_norm = t.norm("post_attention_layernorm.weight", h)?;
            draft.push(DraftLayer { attn_norm, attn, ffn_norm, ffn: expert(&mut within(t, "mlp."), &c)? });
        }
        let draft_norm = if c.draft_layers > 0 { src.norm("mtp.norm.weight", h)? } else { Vec::new() };
        let grid = if c.prompt_rows > 0 { c.prompt_rows } else { c.prefill_chunk };
        let rope = Rope::new(c.head_dim, c.rope_theta);
        Ok(Model { stack, draft, draft_norm, rope, grid, hash, config: c })
    }
}
