//! A model's tensors, each named and shaped once: a model file describes its checkpoint by asking a `Source` for
//! every tensor in turn (name, shape, how a fixture initialises it). The fixture generator's source (`SpecList`)
//! lists them; the loader's (`Load`) reads each from the weight file, checking its shape and naming the tensor
//! on a mismatch. So generation and loading cannot drift apart.

use crate::error::Result;
use crate::fixture::{Init, TensorSpec};
use crate::weights::Weights;

/// Where a model's tensors come from.
pub trait Source {
    /// Tensor `name` of `shape` (`init`: how a fixture fills it).
    fn take(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Vec<f32>>;

    /// A weight matrix `[out, input]`, initialised for unit-variance activations.
    fn linear(&mut self, name: &str, out: usize, input: usize) -> Result<Vec<f32>> {
        self.take(name, &[out, input], Init::Uniform((3.0 / input as f32).sqrt()))
    }

    /// A norm gain of `n` (ones in a fixture).
    fn norm(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        self.take(name, &[n], Init::Ones)
    }
}

/// The tensors under `prefix` of another source (`model.layers.3.` + `self_attn.q_proj.weight`).
pub struct Within<'a> {
    source: &'a mut dyn Source,
    prefix: String,
}

impl Source for Within<'_> {
    fn take(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Vec<f32>> {
        self.source.take(&format!("{}{name}", self.prefix), shape, init)
    }
}

/// `source`'s tensors under `prefix`.
pub fn within<'a>(source: &'a mut dyn Source, prefix: impl Into<String>) -> Within<'a> {
    Within { source, prefix: prefix.into() }
}

/// Lists every tensor asked for (with empty data): the fixture generator's view of a model.
#[derive(Debug, Default)]
pub struct SpecList(pub Vec<TensorSpec>);

impl Source for SpecList {
    fn take(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Vec<f32>> {
        self.0.push(TensorSpec::new(name, shape, init));
        Ok(Vec::new())
    }
}

/// Reads every tensor asked for from a weight file, its shape checked against the file.
pub struct Load<'w>(pub &'w Weights);

impl Source for Load<'_> {
    fn take(&mut self, name: &str, shape: &[usize], _: Init) -> Result<Vec<f32>> {
        self.0.tensor(name, shape)
    }
}
