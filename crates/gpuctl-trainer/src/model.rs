//! A small decoder-only transformer language model (GPT-style, pre-norm): token and learned
//! position embeddings, blocks of causal self-attention and a GELU MLP, a final norm and a
//! vocabulary head. No dropout: a redone step must compute what the first attempt would have.

use tch::nn;
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    pub vocab: i64,
    pub width: i64,
    pub layers: i64,
    pub heads: i64,
    /// Tokens per sample (the context length).
    pub length: i64,
}

impl ModelConfig {
    /// Parameters the model has (for figures in the log and the memory estimate).
    pub fn parameters(&self) -> i64 {
        let (v, w, l) = (self.vocab, self.width, self.length);
        let block =
            2 * 2 * w + (w * 3 * w + 3 * w) + (w * w + w) + (w * 4 * w + 4 * w) + (4 * w * w + w);
        v * w + l * w + self.layers * block + 2 * w + (w * v + v)
    }
}

#[derive(Debug)]
struct Block {
    norm1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    norm2: nn::LayerNorm,
    up: nn::Linear,
    down: nn::Linear,
    heads: i64,
}

/// GPT-2's initialisation: weights from N(0, 0.02), biases zero. An untrained model then
/// predicts nearly uniformly (loss close to log(vocabulary)).
const INIT: nn::Init = nn::Init::Randn {
    mean: 0.0,
    stdev: 0.02,
};

fn linear(path: nn::Path, inputs: i64, outputs: i64) -> nn::Linear {
    let config = nn::LinearConfig {
        ws_init: INIT,
        bs_init: Some(nn::Init::Const(0.0)),
        bias: true,
    };
    nn::linear(path, inputs, outputs, config)
}

fn embedding(path: nn::Path, count: i64, width: i64) -> nn::Embedding {
    let config = nn::EmbeddingConfig {
        ws_init: INIT,
        ..Default::default()
    };
    nn::embedding(path, count, width, config)
}

impl Block {
    fn new(path: &nn::Path, width: i64, heads: i64) -> Block {
        let norm = || nn::LayerNormConfig::default();
        Block {
            norm1: nn::layer_norm(path / "norm1", vec![width], norm()),
            qkv: linear(path / "qkv", width, 3 * width),
            proj: linear(path / "proj", width, width),
            norm2: nn::layer_norm(path / "norm2", vec![width], norm()),
            up: linear(path / "up", width, 4 * width),
            down: linear(path / "down", 4 * width, width),
            heads,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (batch, length, width) = x.size3().expect("activations are [batch, length, width]");
        let head_width = width / self.heads;
        let qkv = x.apply(&self.norm1).apply(&self.qkv);
        let split = |i: i64| {
            qkv.narrow(2, i * width, width)
                .view([batch, length, self.heads, head_width])
                .transpose(1, 2)
        };
        let attended = Tensor::scaled_dot_product_attention(
            &split(0),
            &split(1),
            &split(2),
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        )
        .transpose(1, 2)
        .contiguous()
        .view([batch, length, width]);
        let x = x + attended.apply(&self.proj);
        let mlp = x
            .apply(&self.norm2)
            .apply(&self.up)
            .gelu("none")
            .apply(&self.down);
        x + mlp
    }
}

#[derive(Debug)]
pub struct Model {
    tokens: nn::Embedding,
    positions: nn::Embedding,
    blocks: Vec<Block>,
    norm: nn::LayerNorm,
    head: nn::Linear,
    config: ModelConfig,
}

impl Model {
    pub fn new(root: &nn::Path, config: ModelConfig) -> Model {
        Model {
            tokens: embedding(root / "tokens", config.vocab, config.width),
            positions: embedding(root / "positions", config.length, config.width),
            blocks: (0..config.layers)
                .map(|i| Block::new(&(root / "blocks" / i), config.width, config.heads))
                .collect(),
            norm: nn::layer_norm(root / "norm", vec![config.width], Default::default()),
            head: linear(root / "head", config.width, config.vocab),
            config,
        }
    }

    /// Logits `[batch, length, vocab]` for tokens `[batch, length]`.
    pub fn forward(&self, tokens: &Tensor) -> Tensor {
        let length = tokens.size()[1];
        let positions = Tensor::arange(length, (Kind::Int64, tokens.device()));
        let mut x = tokens.apply(&self.tokens) + positions.apply(&self.positions);
        for block in &self.blocks {
            x = block.forward(&x);
        }
        x.apply(&self.norm).apply(&self.head)
    }

    /// Mean next-token cross entropy of samples `[batch, length + 1]`.
    pub fn loss(&self, samples: &Tensor) -> Tensor {
        let length = self.config.length;
        let inputs = samples.narrow(1, 0, length);
        let targets = samples.narrow(1, 1, length);
        let logits = self.forward(&inputs);
        logits
            .view([-1, self.config.vocab])
            .to_kind(Kind::Float)
            .cross_entropy_for_logits(&targets.reshape([-1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_count_matches_the_variables() {
        let config = ModelConfig {
            vocab: 50,
            width: 32,
            layers: 2,
            heads: 4,
            length: 8,
        };
        tch::manual_seed(0);
        let store = nn::VarStore::new(tch::Device::Cpu);
        let model = Model::new(&store.root(), config);
        let counted: i64 = store
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum();
        assert_eq!(config.parameters(), counted);
        let samples = Tensor::zeros([3, 9], (Kind::Int64, tch::Device::Cpu));
        assert_eq!(model.forward(&samples.narrow(1, 0, 8)).size(), [3, 8, 50]);
        let loss = model.loss(&samples).double_value(&[]);
        // An untrained model is near uniform: log(50) = 3.9.
        assert!((loss - 50f64.ln()).abs() < 0.25, "{loss}");
    }
}
