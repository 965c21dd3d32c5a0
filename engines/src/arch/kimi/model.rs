//! Kimi's config and weights (modelled on kimi_k3.c): most layers are KDA — gated delta-rule linear attention with
//! a per-channel decay, a matrix state per head and short convolutions on q/k/v — and every `mla_every`-th layer
//! and the last are gated MLA without rope (NoPE), caching one latent row per position. MoE FFN everywhere.

use serde::{Deserialize, Serialize};

use crate::arch::checkpoint_layout::Stack;
use crate::arch::cost;
use crate::config::{check_positive, ArchConfig, BaseConfig, Preset};
use crate::error::Result;
use crate::fixture::Init;
use crate::model_cost::{ModelCost, Reach};
use crate::tensors::{within, Source};

/// Kimi's config: the shared base plus its options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: BaseConfig,
    /// Short-convolution width on the KDA layers' q/k/v.
    pub conv_kernel: usize,
    /// Width of the latent row an MLA layer caches per position.
    pub kv_lora: usize,
    /// Every `mla_every`-th layer (1-based) and the last are gated MLA; the rest are KDA (0: only the last).
    #[serde(default)]
    pub mla_every: usize,
}

crate::derefs_to_base!(Config);

impl ArchConfig for Config {
    /// KDA + MLA (NoPE) with a latent of half the hidden width, MLA every 4th layer; MLA has no kv heads.
    fn preset(p: Preset) -> Self {
        let base = BaseConfig::preset("kimi", p);
        let base = BaseConfig { kv_heads: base.heads, ..base };
        Config { conv_kernel: 4, kv_lora: base.hidden / 2, mla_every: 4, base }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        check_positive(
            "kimi",
            &[
                ("kv_lora", self.kv_lora, "the cached latent"),
                ("conv_kernel", self.conv_kernel, "KDA's short convolution"),
            ],
        )
    }

    /// KDA layers: six projections in, one out, and a state update per head (decay, read, delta write, query:
    /// about 8 · head_dim² flops) whatever the context; MLA layers: four projections, each head's query absorbed
    /// and its output decompressed, and attention over the whole context, one latent row per key and head.
    fn cost(&self) -> ModelCost {
        let (h, hd, heads, kvl) = (self.hidden, self.head_dim, self.heads, self.kv_lora);
        let qd = heads * hd;
        let mut m = ModelCost::default();
        for l in 0..self.layers {
            m.token_flops += cost::moe(self);
            if is_mla(self, l) {
                m.token_flops += 2 * cost::matmul(h, qd)
                    + cost::matmul(h, kvl)
                    + cost::matmul(qd, h)
                    + heads as u64 * 2 * cost::matmul(hd, kvl);
                m.attend(Reach::Full, heads as u64 * 2 * cost::matmul(kvl, 1));
            } else {
                m.token_flops += 5 * cost::matmul(h, qd)
                    + cost::matmul(h, heads)
                    + cost::matmul(qd, h)
                    + heads as u64 * 8 * (hd * hd) as u64;
            }
        }
        m
    }
}

/// Kimi Delta Attention: `S ← (I − β k kᵀ) Diag(α) S + β k vᵀ`, `o = Sᵀ q`, per head.
#[derive(Debug, Clone)]
pub struct Kda {
    /// `[heads · head_dim, hidden]` each.
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    /// Depthwise causal convolutions `[conv_kernel, heads · head_dim]` (oldest tap first).
    pub conv_q: Vec<f32>,
    pub conv_k: Vec<f32>,
    pub conv_v: Vec<f32>,
    /// Per-channel decay input `[heads · head_dim, hidden]`; α = exp(−A_h · softplus(f)).
    pub wf: Vec<f32>,
    /// `[heads]`: A_h = 0.1 · exp(a_log_h).
    pub a_log: Vec<f32>,
    /// Write strength `[heads, hidden]`; β = sigmoid.
    pub wb: Vec<f32>,
    /// Output gate `[heads · head_dim, hidden]`.
    pub wg: Vec<f32>,
    pub o_norm: Vec<f32>,
    pub wo: Vec<f32>,
}

/// Gated MLA (NoPE): queries are absorbed into the latent space, so attention reads the cached latent rows
/// directly as keys and values, and the per-head value up-projection runs on the pooled latent.
#[derive(Debug, Clone)]
pub struct Mla {
    pub wq: Vec<f32>,
    /// Down-projection to the latent `[kv_lora, hidden]`, and its norm.
    pub w_dkv: Vec<f32>,
    pub kv_norm: Vec<f32>,
    /// Per head, the key up-projection transposed: `[heads][kv_lora, head_dim]` (absorbs q into the latent).
    pub k_up_t: Vec<Vec<f32>>,
    /// Per head, the value up-projection `[heads][head_dim, kv_lora]`.
    pub v_up: Vec<Vec<f32>>,
    pub wg: Vec<f32>,
    pub wo: Vec<f32>,
}

#[derive(Debug, Clone)]
pub enum Mixer {
    Kda(Kda),
    Mla(Mla),
}

/// The whole model; shared (`Arc`) by warm and cold instances. A block's `attn` is its mixer.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: Config,
    pub stack: Stack<Mixer>,
    /// Short hash of config + weights.
    pub hash: String,
}

/// Whether layer `l` is a gated MLA layer (every `mla_every`-th, 1-based, and the last); the rest are KDA.
pub fn is_mla(c: &Config, l: usize) -> bool {
    l + 1 == c.layers || (c.mla_every > 0 && (l + 1).is_multiple_of(c.mla_every))
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

impl Model {
    /// The model from `src`, every tensor named once, in checkpoint order.
    pub fn build(c: Config, src: &mut dyn Source, hash: String) -> Result<Model> {
        let (h, hd) = (c.hidden, c.head_dim);
        let qd = c.heads * hd;
        let stack = Stack::build(src, &c, |t, i| {
            let a = &mut within(t, "self_attn.");
            Ok(if is_mla(&c, i) {
                let wq = a.linear("q_proj.weight", qd, h)?;
                let w_dkv = a.linear("kv_a_proj.weight", c.kv_lora, h)?;
                let kv_norm = a.norm("kv_a_norm.weight", c.kv_lora)?;
                let k_up = a.linear("k_up_proj.weight", qd, c.kv_lora)?;
                let v_up = a.linear("v_up_proj.weight", qd, c.kv_lora)?;
                let per_head = hd * c.kv_lora;
                Mixer::Mla(Mla {
                    wq,
                    w_dkv,
                    kv_norm,
                    k_up_t: k_up.chunks_exact(per_head).map(|m| transpose(m, hd, c.kv_lora)).collect(),
                    v_up: v_up.chunks_exact(per_head).map(<[f32]>::to_vec).collect(),
                    wg: a.linear("g_proj.weight", qd, h)?,
                    wo: a.linear("o_proj.weight", h, qd)?,
                })
            } else {
                let conv = Init::Uniform((3.0 / c.conv_kernel.max(1) as f32).sqrt());
                let (wq, wk, wv) = (
                    a.linear("q_proj.weight", qd, h)?,
                    a.linear("k_proj.weight", qd, h)?,
                    a.linear("v_proj.weight", qd, h)?,
                );
                Mixer::Kda(Kda {
                    wq,
                    wk,
                    wv,
                    conv_q: a.take("q_conv.weight", &[c.conv_kernel, qd], conv)?,
                    conv_k: a.take("k_conv.weight", &[c.conv_kernel, qd], conv)?,
                    conv_v: a.take("v_conv.weight", &[c.conv_kernel, qd], conv)?,
                    wf: a.linear("f_proj.weight", qd, h)?,
                    a_log: a.take("a_log", &[c.heads], Init::Uniform(1.0))?,
                    wb: a.linear("b_proj.weight", c.heads, h)?,
                    wg: a.linear("g_proj.weight", qd, h)?,
                    o_norm: a.norm("o_norm.weight", hd)?,
                    wo: a.linear("o_proj.weight", h, qd)?,
                })
            })
        })?;
        Ok(Model { stack, hash, config: c })
    }
}
