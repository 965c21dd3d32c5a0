//! The llama arch's config and weights: token embedding, per layer RMSNorm → GQA attention with RoPE → RMSNorm →
//! SwiGLU FFN, a final RMSNorm and the output head (tied to the embedding when the file has no `output.weight`).
//!
//! Weights stay in their storage type (Q4_1, Q8_0 or F32 GGUF blocks, read through the file's memory map); only
//! the norm gains are read into f32. A synthetic model (a preset) comes from a `Source` as F32 matrices.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::arch::cost;
use crate::config::{ArchConfig, BaseConfig, Preset};
use crate::error::{EngineError, Result};
use crate::gguf::{GgmlType, Gguf};
use crate::kernels::{QBytes, QMatrix, QType};
use crate::model_cost::{ModelCost, Reach};
use crate::tensors::Source;
use crate::text_tokenizer::GgufTokenizer;

/// The llama config: the shared base (its MoE fields fixed at one dense FFN) plus the rope layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: BaseConfig,
    /// Leading dimensions of each head that RoPE rotates (`head_dim` for SmolLM2).
    pub rope_dim: usize,
}

crate::derefs_to_base!(Config);

impl ArchConfig for Config {
    /// The base preset's shape with one dense SwiGLU FFN per layer.
    fn preset(p: Preset) -> Self {
        let mut base = BaseConfig::preset("llama", p);
        base.experts = 1;
        base.top_k = 1;
        base.shared_experts = 0;
        Config { rope_dim: base.head_dim, base }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return Err(format!("field `rope_dim` ({}) must be even and at most `head_dim`", self.rope_dim));
        }
        Ok(())
    }

    /// Every layer: GQA projections and one dense SwiGLU FFN; attention over the whole context.
    fn cost(&self) -> ModelCost {
        let layers = self.layers as u64;
        let mut m =
            ModelCost { token_flops: layers * (cost::gqa_proj(self) + cost::dense_ffn(self)), attention: Vec::new() };
        m.attend(Reach::Full, layers * cost::gqa_key(self));
        m
    }
}

impl Config {
    /// The config a GGUF file's `llama.*` metadata describes; every key read is named in the error it causes.
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.architecture()?;
        if arch != "llama" {
            return Err(EngineError::Weights {
                path: g.path().into(),
                message: format!("general.architecture is `{arch}`, not llama"),
            });
        }
        let hidden = g.usize("llama.embedding_length")?;
        let heads = g.usize("llama.attention.head_count")?;
        let kv_heads = g.usize("llama.attention.head_count_kv")?;
        let bad = |message: String| EngineError::Weights { path: g.path().into(), message };
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(bad(format!("llama.embedding_length {hidden} is not a multiple of head_count {heads}")));
        }
        let head_dim = hidden / heads;
        let vocab = match g.usize("llama.vocab_size") {
            Ok(v) => v,
            Err(_) => g.array("tokenizer.ggml.tokens")?.1.len(),
        };
        let max_ctx = g.usize("llama.context_length")?;
        let rope_dim = g.usize("llama.rope.dimension_count").unwrap_or(head_dim);
        let base = BaseConfig {
            arch: "llama".into(),
            preset: None,
            vocab,
            hidden,
            layers: g.usize("llama.block_count")?,
            heads,
            kv_heads,
            head_dim,
            ffn: g.usize("llama.feed_forward_length")?,
            experts: 1,
            top_k: 1,
            shared_experts: 0,
            max_ctx,
            initial_capacity: 512.min(max_ctx),
            prefill_chunk: 256,
            slots: 1,
            rope_theta: g.float("llama.rope.freq_base").unwrap_or(10000.0) as f32,
            norm_eps: g.float("llama.attention.layer_norm_rms_epsilon")? as f32,
        };
        let c = Config { base, rope_dim };
        c.validate().map_err(bad)?;
        Ok(c)
    }
}

/// One decoder layer (`qd = heads · head_dim`, `kvd = kv_heads · head_dim`).
#[derive(Debug, Clone)]
pub struct Layer {
    /// `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// `[qd, hidden]`, `[kvd, hidden]`, `[kvd, hidden]`, `[hidden, qd]`.
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub wo: QMatrix,
    /// `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// `[ffn, hidden]`, `[ffn, hidden]`, `[hidden, ffn]`.
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: Config,
    /// `[vocab, hidden]`: rows dequantized as ids are looked up.
    pub embed: QMatrix,
    pub layers: Vec<Layer>,
    /// `[hidden]`.
    pub final_norm: Vec<f32>,
    /// `[vocab, hidden]` (the embedding itself when tied).
    pub output: QMatrix,
    /// The id that ends a reply (`tokenizer.ggml.eos_token_id`; the byte tokenizer's for a synthetic model).
    pub eos: u32,
    /// Short hash of config + weights.
    pub hash: String,
    /// The file's tokenizer and chat template (`None` for a synthetic model: the bundled byte tokenizer).
    pub text: Option<Arc<GgufTokenizer>>,
}

/// Where the model's tensors come from, by their GGUF names.
trait Tensors {
    fn matrix(&mut self, name: &str, out: usize, input: usize) -> Result<QMatrix>;
    fn vector(&mut self, name: &str, n: usize) -> Result<Vec<f32>>;
    /// The output head: `output.weight`, or the embedding when the weights are tied.
    fn output(&mut self, embed: &QMatrix, vocab: usize, hidden: usize) -> Result<QMatrix>;
}

/// A synthetic checkpoint's tensors, as F32 matrices.
struct FromSource<'a>(&'a mut dyn Source);

fn f32_matrix(w: Vec<f32>, out: usize, input: usize) -> QMatrix {
    // a spec list returns no data: an empty matrix stands in
    let out = if w.is_empty() { 0 } else { out };
    QMatrix::quantize(QType::F32, &w, out, input)
}

impl Tensors for FromSource<'_> {
    fn matrix(&mut self, name: &str, out: usize, input: usize) -> Result<QMatrix> {
        Ok(f32_matrix(self.0.linear(name, out, input)?, out, input))
    }
    fn vector(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        self.0.norm(name, n)
    }
    fn output(&mut self, _: &QMatrix, vocab: usize, hidden: usize) -> Result<QMatrix> {
        self.matrix("output.weight", vocab, hidden)
    }
}

/// A GGUF file's tensors, read in place through its memory map.
struct FromGguf(Arc<Gguf>);

impl Tensors for FromGguf {
    fn matrix(&mut self, name: &str, out: usize, input: usize) -> Result<QMatrix> {
        let g = &self.0;
        let t = g.tensor(name)?;
        if t.info.shape() != [out, input] {
            return Err(g.tensor_error(name, format!("shape {:?}, expected [{out}, {input}]", t.info.shape())));
        }
        let ty = match t.info.ty {
            GgmlType::F32 => QType::F32,
            GgmlType::Q4_1 => QType::Q4_1,
            GgmlType::Q8_0 => QType::Q8_0,
            other => return Err(g.tensor_error(name, format!("type {other} (F32, Q4_1 and Q8_0 are read)"))),
        };
        let start = g.data_start() + t.info.offset as usize;
        let src: Arc<dyn AsRef<[u8]> + Send + Sync> = self.0.clone();
        let bytes = QBytes::Shared { src, start, len: t.bytes.len() };
        QMatrix::new(ty, out, input, bytes).map_err(|e| g.tensor_error(name, e))
    }

    fn vector(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        let g = &self.0;
        let t = g.tensor(name)?;
        if t.info.ty != GgmlType::F32 || t.info.shape() != [n] {
            return Err(g.tensor_error(name, format!("{} {:?}, expected F32 [{n}]", t.info.ty, t.info.shape())));
        }
        Ok(t.bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn output(&mut self, embed: &QMatrix, vocab: usize, hidden: usize) -> Result<QMatrix> {
        if self.0.tensor_info("output.weight").is_some() {
            self.matrix("output.weight", vocab, hidden)
        } else {
            Ok(embed.clone())
        }
    }
}

impl Model {
    /// The model from `src` (a synthetic checkpoint), every tensor named once, in file order.
    pub fn build(c: Config, src: &mut dyn Source, hash: String) -> Result<Model> {
        Self::assemble(c, &mut FromSource(src), hash, crate::tokenizer::EOS)
    }

    /// The model a GGUF file holds: config from its metadata, weights read in place.
    pub fn from_gguf(g: Arc<Gguf>) -> Result<Model> {
        let c = Config::from_gguf(&g)?;
        let hash = gguf_hash(&c, &g);
        let eos = g.uint("tokenizer.ggml.eos_token_id")?;
        let eos = u32::try_from(eos).ok().filter(|&e| (e as usize) < c.vocab).ok_or_else(|| EngineError::Weights {
            path: g.path().into(),
            message: format!("metadata key `tokenizer.ggml.eos_token_id`: {eos} is outside the vocabulary"),
        })?;
        let text = Arc::new(GgufTokenizer::from_gguf(&g)?);
        let mut model = Self::assemble(c, &mut FromGguf(g), hash, eos)?;
        model.text = Some(text);
        Ok(model)
    }

    fn assemble(c: Config, t: &mut dyn Tensors, hash: String, eos: u32) -> Result<Model> {
        let (h, f) = (c.hidden, c.ffn);
        let (qd, kvd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let embed = t.matrix("token_embd.weight", c.vocab, h)?;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: t.vector(&n("attn_norm"), h)?,
                wq: t.matrix(&n("attn_q"), qd, h)?,
                wk: t.matrix(&n("attn_k"), kvd, h)?,
                wv: t.matrix(&n("attn_v"), kvd, h)?,
                wo: t.matrix(&n("attn_output"), h, qd)?,
                ffn_norm: t.vector(&n("ffn_norm"), h)?,
                gate: t.matrix(&n("ffn_gate"), f, h)?,
                up: t.matrix(&n("ffn_up"), f, h)?,
                down: t.matrix(&n("ffn_down"), h, f)?,
            });
        }
        let final_norm = t.vector("output_norm.weight", h)?;
        let output = t.output(&embed, c.vocab, h)?;
        Ok(Model { config: c, embed, layers, final_norm, output, eos, hash, text: None })
    }
}

/// The model hash of a GGUF model: its config and the file's header (metadata and tensor directory: names,
/// types, shapes, offsets), sampled data bytes around each tensor's start, and the file's length.
fn gguf_hash(c: &Config, g: &Gguf) -> String {
    use sha2::Digest;
    crate::arch::model_hash::hash_of(c, |hasher| {
        let raw = g.raw();
        hasher.update(&raw[..g.data_start().min(raw.len())]);
        hasher.update((raw.len() as u64).to_le_bytes());
        for t in g.tensors() {
            let at = g.data_start() + t.offset as usize;
            hasher.update(&raw[at..(at + 4096.min(t.size as usize))]);
        }
    })
}
