"""Transformer language model (decoder only) and encoder-decoder translation model, as fairseq builds
them for Gao et al. (2019) and Yu et al. (2022).

Vaswani et al. (2017) with fairseq's conventions (``transformer_wmt_en_de``, ``transformer_lm``):

    x_0 = sqrt(d) * E[y] + P[pos]                 (embedding scaled by sqrt(d_model), then positions)
    x_0 = dropout(x_0)
    post-norm (norm_first=false, Vaswani / transformer_wmt_en_de):
        x = LN(x + dropout(Sublayer(x)))
    pre-norm (norm_first=true, fairseq transformer_lm forces decoder_normalize_before):
        x = x + dropout(Sublayer(LN(x))),  and a final LN after the last layer
    Sublayer: MultiHead(Q, K, V) = Concat(head_1..head_H) W_O + b_O,
              head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_h) + mask) V W_i^V   (attention_dropout on
              the softmax weights), d_h = d_model / n_heads;
              FFN(x) = W_2 dropout_act(act(W_1 x + b_1)) + b_2, act = relu | gelu (exact, erf).
    logits = h E^T (tied) or h W^T (untied); fairseq has no output bias (``tied_output_bias`` adds one).

Positions: sinusoidal as fairseq/tensor2tensor (the first half of the channels sin, the second half
cos, frequencies 10000^(-i / (d/2 - 1))) or learned (``max_positions`` rows, N(0, d^-0.5)). Positions
count from 0 here; fairseq counts from padding_idx + 1 (and its learned table has padding_idx + 1 extra
rows), an offset that changes nothing but the absolute phase of the sinusoids.

Initialisation as fairseq: embeddings N(0, d^-0.5) with the padding row zero, every Linear
xavier_uniform (q/k/v projections with gain 1/sqrt(2), as fairseq's MultiheadAttention), biases 0
(fairseq leaves the q/k/v biases at PyTorch's default U(+-1/sqrt(d)); we zero them), LayerNorm (1, 0).

Two models:

* :class:`TransformerLM` (arch ``transformer_lm``): decoder only, causal self-attention. Takes the
  same (T, B) token layout as the LSTMs and returns (T, B, d) hidden states; no state is carried
  between segments (each block is its own context, as fairseq's ``tokens_per_sample`` blocks).
* :class:`TransformerSeq2Seq` (arch ``transformer``): encoder-decoder with a batch-first API
  (``encode``, ``decode`` with an incremental cache for beam search, ``reorder_cache``). Source and
  target share one (joined) vocabulary, so the encoder and decoder input embeddings are always one
  matrix; ``tie_weights=true`` also uses it as the output projection (fairseq
  ``--share-all-embeddings``), ``false`` adds a separate output matrix. Right-padded sources are masked
  in encoder self-attention and in cross-attention; padding in the target prefix needs no mask (the
  causal mask keeps it out of every real position, and the loss ignores padded positions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from omegaconf import MISSING
from repdegen.core.errors import ConfigError
from repdegen.models import register_model
from repdegen.models.base import LanguageModel, ModelOutput
from torch import nn
from torch.nn import functional as F

ACTIVATIONS = ("relu", "gelu")
POSITIONS = ("sinusoidal", "learned")


@dataclass
class TransformerSizes:
    """What every Transformer here shares (the subclasses add their layer counts and defaults)."""

    arch: str = MISSING
    name: str = MISSING
    d_model: int = 512
    n_heads: int = 8
    d_ffn: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    positions: str = "sinusoidal"
    # longest sequence the learned position table covers (sinusoidal positions have no limit)
    max_positions: int = 1024
    tie_weights: bool = True
    # add an output bias (zero at init); fairseq has none, tied or not
    tied_output_bias: bool = False


@dataclass
class TransformerLMConfig(TransformerSizes):
    arch: str = "transformer_lm"
    name: str = "transformer_lm"
    n_layers: int = 6
    # fairseq's transformer_lm always uses pre-norm plus a final LayerNorm
    norm_first: bool = True
    # None: no padding row. LM streams are never padded, and id 0 of a word-level vocabulary is its
    # most frequent word, whose embedding must train
    pad_id: int | None = None


@dataclass
class TransformerSeq2SeqConfig(TransformerSizes):
    arch: str = "transformer"
    name: str = "transformer"
    encoder_layers: int = 6
    decoder_layers: int = 6
    # Vaswani et al. / fairseq transformer_wmt_en_de: post-norm, no final LayerNorm
    norm_first: bool = False
    # tie_weights true: one matrix for encoder input, decoder input and output (fairseq
    # --share-all-embeddings); false: a separate output matrix (the input embedding stays shared:
    # the vocabulary is joint)
    pad_id: int = 0


# ------------------------------------------------------------------------------------------ blocks
def sinusoidal_embedding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """fairseq/tensor2tensor sinusoids for integer ``positions`` (any shape) -> (..., dim) float32:
    ``[sin(p * f_0..f_{h-1}), cos(p * f_0..f_{h-1})]`` with h = dim // 2 and
    f_i = exp(-i * ln(10000) / (h - 1)); an odd ``dim`` gets a zero last channel."""
    half = dim // 2
    step = math.log(10000.0) / max(half - 1, 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=positions.device) * -step)
    angles = positions.to(torch.float32).unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class MultiheadAttention(nn.Module):
    """Scaled dot-product attention with separate q/k/v/out projections (with bias), as fairseq.

    Tensors are batch first: query (B, T, d), key_value (B, S, d) -> (B, T, d). ``key_padding_mask``
    (B, S) is True at padding keys; ``causal`` lets query i see keys j <= i + (S - T) (with a cache the
    queries are the last T of S positions). ``cache`` is a dict this module fills with the projected
    keys and values (B, H, S, d_h): appended to at every call for self-attention, computed once and
    reused when ``static_kv`` (cross-attention over a fixed memory).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
            nn.init.zeros_(proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d) -> (B, H, T, d_h)
        return x.view(x.size(0), x.size(1), self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None,
        *,
        key_padding_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: dict | None = None,
        static_kv: bool = False,
    ) -> torch.Tensor:
        q = self._split_heads(self.q_proj(query))
        if cache is not None and static_kv and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            k = self._split_heads(self.k_proj(key_value))
            v = self._split_heads(self.v_proj(key_value))
            if cache is not None:
                if not static_kv and "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        T, S = q.size(2), k.size(2)
        mask = None  # boolean, True = may attend (scaled_dot_product_attention's convention)
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, None, None, :]
        is_causal = False
        if causal and T > 1:
            if mask is None and T == S:
                is_causal = True  # lets the fused (flash) kernels run
            else:
                allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
                mask = allowed if mask is None else mask & allowed
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )
        out = out.transpose(1, 2).reshape(query.size(0), T, -1)
        return self.out_proj(out)


class TransformerLayer(nn.Module):
    """An encoder layer (self-attention, FFN) or, with ``cross_attention``, a decoder layer
    (self-attention, attention over the encoder memory, FFN); post-norm or pre-norm residuals."""

    def __init__(self, cfg: Any, cross_attention: bool):
        super().__init__()
        d = cfg.d_model
        self.norm_first = cfg.norm_first
        self.dropout = cfg.dropout
        self.activation_dropout = cfg.activation_dropout
        self.activation = F.relu if cfg.activation == "relu" else F.gelu
        self.self_attn = MultiheadAttention(d, cfg.n_heads, cfg.attention_dropout)
        self.self_attn_norm = nn.LayerNorm(d)
        if cross_attention:
            self.cross_attn = MultiheadAttention(d, cfg.n_heads, cfg.attention_dropout)
            self.cross_attn_norm = nn.LayerNorm(d)
        else:
            self.cross_attn = self.cross_attn_norm = None
        self.fc1 = nn.Linear(d, cfg.d_ffn)
        self.fc2 = nn.Linear(cfg.d_ffn, d)
        self.ffn_norm = nn.LayerNorm(d)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)

    def _residual(self, x: torch.Tensor, norm: nn.LayerNorm, sublayer) -> torch.Tensor:
        if self.norm_first:
            return x + F.dropout(sublayer(norm(x)), self.dropout, self.training)
        return norm(x + F.dropout(sublayer(x), self.dropout, self.training))

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(self.activation(self.fc1(x)), self.activation_dropout, self.training)
        return self.fc2(h)

    def forward(
        self,
        x: torch.Tensor,
        *,
        causal: bool = False,
        pad_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_pad_mask: torch.Tensor | None = None,
        cache: dict | None = None,
    ) -> torch.Tensor:
        self_cache = cache.setdefault("self", {}) if cache is not None else None
        x = self._residual(
            x, self.self_attn_norm,
            lambda h: self.self_attn(h, h, key_padding_mask=pad_mask, causal=causal, cache=self_cache),
        )
        if self.cross_attn is not None:
            cross_cache = cache.setdefault("cross", {}) if cache is not None else None
            x = self._residual(
                x, self.cross_attn_norm,
                lambda h: self.cross_attn(h, memory, key_padding_mask=memory_pad_mask, cache=cross_cache, static_kv=True),
            )
        return self._residual(x, self.ffn_norm, self._ffn)


class TransformerStack(nn.Module):
    """Positions, a stack of layers and (pre-norm only) a final LayerNorm: one encoder or decoder."""

    def __init__(self, cfg: Any, n_layers: int, cross_attention: bool):
        super().__init__()
        self.d_model = cfg.d_model
        self.max_positions = cfg.max_positions
        self.dropout = cfg.dropout
        if cfg.positions == "learned":
            self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
            nn.init.normal_(self.positions.weight, mean=0.0, std=cfg.d_model**-0.5)
        else:
            self.positions = None
        self.layers = nn.ModuleList(TransformerLayer(cfg, cross_attention) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else None

    def embed(self, embedding: nn.Embedding, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """dropout(sqrt(d) * E[tokens] + P[start .. start + T - 1]) for (B, T) tokens -> (B, T, d)."""
        T = tokens.size(1)
        if start + T > self.max_positions and self.positions is not None:
            raise ValueError(
                f"a sequence of {start + T} tokens is longer than the learned position table "
                f"(model.max_positions={self.max_positions}); raise model.max_positions or use shorter blocks"
            )
        x = embedding(tokens) * math.sqrt(self.d_model)
        pos = torch.arange(start, start + T, device=tokens.device)
        if self.positions is not None:
            x = x + self.positions(pos)
        else:
            x = x + sinusoidal_embedding(pos, self.d_model).to(x.dtype)
        return F.dropout(x, self.dropout, self.training)

    def forward(self, x: torch.Tensor, *, caches: list[dict] | None = None, **kwargs) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, cache=caches[i] if caches is not None else None, **kwargs)
        return self.final_norm(x) if self.final_norm is not None else x


def _reorder(obj: Any, index: torch.Tensor) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.index_select(0, index)
    if isinstance(obj, dict):
        for key, value in obj.items():
            obj[key] = _reorder(value, index)
        return obj
    if isinstance(obj, list):
        obj[:] = [_reorder(value, index) for value in obj]
        return obj
    return obj


def _cached_steps(cache: dict) -> int:
    layers = cache.get("layers")
    if not layers or "self" not in layers[0]:
        return 0
    return layers[0]["self"]["k"].size(2)


# ------------------------------------------------------------------------------- config checking
def _validate(cfg: Any, layer_keys: tuple[str, ...]) -> None:
    for key in ("d_model", "n_heads", "d_ffn", "max_positions", *layer_keys):
        value = getattr(cfg, key)
        if value < 1:
            raise ConfigError(f"model.{key}={value} must be a positive integer")
    if cfg.d_model % cfg.n_heads:
        near = max(cfg.n_heads, round(cfg.d_model / cfg.n_heads) * cfg.n_heads)
        raise ConfigError(
            f"model.d_model={cfg.d_model} must be divisible by model.n_heads={cfg.n_heads} (each head gets "
            f"d_model / n_heads dimensions); set model.d_model to a multiple of {cfg.n_heads} (e.g. {near}) "
            f"or change model.n_heads"
        )
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        value = getattr(cfg, key)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"model.{key}={value} must be a drop probability in [0, 1)")
    if cfg.activation not in ACTIVATIONS:
        raise ConfigError(f"model.activation={cfg.activation!r} is not one of {', '.join(ACTIVATIONS)}")
    if cfg.positions not in POSITIONS:
        raise ConfigError(f"model.positions={cfg.positions!r} is not one of {', '.join(POSITIONS)}")
    if cfg.pad_id is not None and cfg.pad_id < 0:
        raise ConfigError(f"model.pad_id={cfg.pad_id} must be a token id (>= 0), the vocabulary's padding symbol")


class _TransformerBase(LanguageModel):
    """What both Transformers share: sizes, checks, the (tied) embedding and output layer."""

    WIDTH_FIELDS = ("d_model", "d_ffn")

    @staticmethod
    def check_tie(cfg, tie: bool) -> None:
        """Tying always fits: the embedding and the last hidden state both have d_model dimensions."""

    @staticmethod
    def scale_widths(cfg, mult: float, min_width: int):
        """Shrink or grow the widths in place (and return ``cfg``): ``d_ffn`` becomes
        max(min_width, round(d_ffn * mult)); ``d_model`` the multiple of ``n_heads`` nearest to
        max(min_width, d_model * mult), at least max(2 * n_heads, min_width) so every head keeps
        two or more dimensions."""
        h = cfg.n_heads
        target = max(min_width, cfg.d_model * mult)
        k = max(2, round(target / h), math.ceil(min_width / h))
        cfg.d_model = int(k * h)
        cfg.d_ffn = int(max(min_width, round(cfg.d_ffn * mult)))
        return cfg

    def _build_embeddings(self, cfg: Any, vocab_size: int, tie_weights: bool) -> None:
        if cfg.pad_id is not None and not 0 <= cfg.pad_id < vocab_size:
            raise ConfigError(
                f"model.pad_id={cfg.pad_id} is outside the vocabulary of {vocab_size} types; "
                f"set model.pad_id to the padding symbol's id"
            )
        self.cfg = cfg
        self.tie_weights = tie_weights
        self.pad_id = cfg.pad_id
        self.embedding = nn.Embedding(vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=cfg.d_model**-0.5)
        if cfg.pad_id is not None:
            with torch.no_grad():
                self.embedding.weight[cfg.pad_id].zero_()
        if tie_weights:
            self.output_weight = None
        else:
            self.output_weight = nn.Parameter(torch.empty(vocab_size, cfg.d_model))
            nn.init.normal_(self.output_weight, mean=0.0, std=cfg.d_model**-0.5)
        self.output_bias_param = nn.Parameter(torch.zeros(vocab_size)) if cfg.tied_output_bias else None

    def init_state(self, batch_size: int, device=None):
        return None

    def reorder_cache(self, cache: dict, index: torch.Tensor) -> None:
        """Select (and repeat/reorder) the batch rows of an incremental-decoding cache, in place:
        every cached tensor becomes ``tensor.index_select(0, index)`` (beam search)."""
        _reorder(cache, index)

    def parameter_breakdown(self) -> dict[str, int]:
        """Counts by part: ``embedding``, ``output_weight`` / ``output_bias`` (when present), and per
        stack ``<stack>.positions`` (learned only), ``<stack>.layers.<i>``, ``<stack>.final_norm``."""
        parts: dict[str, int] = {}
        for name, p in self.named_parameters():
            fields = name.split(".")
            if fields[0] in ("encoder", "decoder"):
                part = ".".join(fields[:3] if fields[1] == "layers" else fields[:2])
            else:
                part = fields[0].replace("_param", "")
            parts[part] = parts.get(part, 0) + p.numel()
        return parts


# ----------------------------------------------------------------------------------------- models
@register_model("transformer_lm", TransformerLMConfig)
class TransformerLM(_TransformerBase):
    """Decoder-only Transformer LM (fairseq ``transformer_lm``): (T, B) tokens -> (T, B, d) states."""

    incremental_lm = True  # repdegen.models.generation.lm_continue decodes with the key/value cache of decode()

    @staticmethod
    def validate_config(cfg) -> None:
        _validate(cfg, ("n_layers",))

    def __init__(self, cfg: TransformerLMConfig, vocab_size: int, tie_weights: bool):
        super().__init__()
        self._build_embeddings(cfg, vocab_size, tie_weights)
        self.decoder = TransformerStack(cfg, cfg.n_layers, cross_attention=False)

    def decode(self, prev: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        """Batch-first: ``prev`` (B, T) -> hidden (B, T, d). With a ``cache`` dict (start with ``{}``),
        ``prev`` holds every token so far and only the last position is computed: (B, 1, d)."""
        if cache is None:
            return self.decoder(self.decoder.embed(self.embedding, prev), causal=True)
        t = prev.size(1)
        if _cached_steps(cache) != t - 1:
            raise ValueError(f"the cache holds {_cached_steps(cache)} steps but prev has {t} tokens (expected {t - 1} cached)")
        caches = cache.setdefault("layers", [{} for _ in self.decoder.layers])
        x = self.decoder.embed(self.embedding, prev[:, -1:], start=t - 1)
        return self.decoder(x, causal=True, caches=caches)

    def forward(self, tokens: torch.Tensor, state: Any = None) -> ModelOutput:
        hidden = self.decode(tokens.t())
        return ModelOutput(hidden=hidden.transpose(0, 1).contiguous(), state=None)


class EncoderOut(NamedTuple):
    """The encoder's output: ``memory`` (B, S, d) and ``pad_mask`` (B, S), True at source padding."""

    memory: torch.Tensor
    pad_mask: torch.Tensor

    def index_select(self, index: torch.Tensor) -> EncoderOut:
        """The rows ``index`` of the batch (beam search: repeat each sentence, follow reorderings)."""
        return EncoderOut(self.memory.index_select(0, index), self.pad_mask.index_select(0, index))


@register_model("transformer", TransformerSeq2SeqConfig)
class TransformerSeq2Seq(_TransformerBase):
    """Encoder-decoder Transformer (fairseq ``transformer``), batch first, joined vocabulary."""

    @staticmethod
    def validate_config(cfg) -> None:
        _validate(cfg, ("encoder_layers", "decoder_layers"))

    def __init__(self, cfg: TransformerSeq2SeqConfig, vocab_size: int, tie_weights: bool):
        super().__init__()
        self._build_embeddings(cfg, vocab_size, tie_weights)
        self.encoder = TransformerStack(cfg, cfg.encoder_layers, cross_attention=False)
        self.decoder = TransformerStack(cfg, cfg.decoder_layers, cross_attention=True)

    def encode(self, src: torch.Tensor) -> EncoderOut:
        """Right-padded source (B, S) -> EncoderOut(memory (B, S, d), pad_mask (B, S))."""
        pad_mask = src.eq(self.pad_id)
        x = self.encoder.embed(self.embedding, src)
        return EncoderOut(self.encoder(x, pad_mask=pad_mask), pad_mask)

    def decode(self, prev: torch.Tensor, enc: EncoderOut, cache: dict | None = None) -> torch.Tensor:
        """Target prefix (B, T) -> hidden (B, T, d), teacher forced with a causal mask.

        With a ``cache`` dict (start with ``{}``): incremental decoding. ``prev`` holds all T tokens
        so far and only position T - 1 is computed, (B, 1, d); self-attention keys/values are
        appended to the cache, cross-attention keys/values of ``enc.memory`` (and its padding mask)
        are computed at the first step and kept, so later steps read them from the cache. Reorder
        the cache with :meth:`reorder_cache` (and ``enc`` with ``enc.index_select``) between steps.
        """
        if cache is None:
            x = self.decoder.embed(self.embedding, prev)
            return self.decoder(x, causal=True, memory=enc.memory, memory_pad_mask=enc.pad_mask)
        t = prev.size(1)
        if _cached_steps(cache) != t - 1:
            raise ValueError(f"the cache holds {_cached_steps(cache)} steps but prev has {t} tokens (expected {t - 1} cached)")
        if "memory_pad_mask" not in cache:
            cache["memory_pad_mask"] = enc.pad_mask
        caches = cache.setdefault("layers", [{} for _ in self.decoder.layers])
        x = self.decoder.embed(self.embedding, prev[:, -1:], start=t - 1)
        return self.decoder(x, causal=True, memory=enc.memory, memory_pad_mask=cache["memory_pad_mask"], caches=caches)

    def forward(self, src: torch.Tensor, prev: torch.Tensor) -> ModelOutput:
        """Teacher forcing: source (B, S), shifted target prefix (B, T) -> hidden (B, T, d)."""
        return ModelOutput(hidden=self.decode(prev, self.encode(src)), state=None)
