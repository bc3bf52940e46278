"""The BERT family's masked LMs (BERT, RoBERTa, XLM-R, DistilBERT: the bodies of most SPLADE models) in plain torch.

Why not transformers' classes: importing them costs every process that encodes or searches seconds (transformers
scans thousands of its source files at import, far longer on a slow file system), more than a small model's whole
query. These modules carry transformers' parameter names, so a checkpoint loads by name, and tests compare their
outputs with transformers' own forward, padded and packed, for each family. A model outside what is written here
(another family, relative positions, an unknown activation, a decoder, weights that do not fit) returns None from
`load`, and model.load builds it with transformers instead, which also words the errors of a broken checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from lsr_index.model import packed

_PREFIX = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta", "distilbert": "distilbert"}
_ACTIVATIONS = {
    "gelu": F.gelu, "relu": F.relu, "silu": F.silu, "swish": F.silu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True)
class FamilyConfig:
    """What the modules need of a config.json, under the names the rest of lsr-index reads (transformers' own)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    hidden_act: str
    head_act: str  # the masked-LM head's activation: RoBERTa's is GELU whatever the body's
    layer_norm_eps: float
    type_vocab_size: int
    pad_token_id: int
    tie_word_embeddings: bool = True  # a decoder weight the checkpoint leaves out is the word embeddings'


def family_config(settings: dict) -> FamilyConfig | None:
    """The config if this module runs the model it describes, else None."""
    kind = settings.get("model_type")
    if not isinstance(kind, str) or kind not in _PREFIX or settings.get("is_decoder") \
            or settings.get("add_cross_attention"):
        return None
    try:
        if kind == "distilbert":
            if settings.get("sinusoidal_pos_embds"):
                return None
            act = settings.get("activation", "gelu")
            config = FamilyConfig(kind, settings["vocab_size"], settings.get("dim", 768), settings.get("n_layers", 6),
                                  settings.get("n_heads", 12), settings.get("hidden_dim", 3072),
                                  settings.get("max_position_embeddings", 512), act, act, 1e-12, 0,
                                  settings.get("pad_token_id", 0), settings.get("tie_word_embeddings", True))
        else:
            if settings.get("position_embedding_type", "absolute") != "absolute":
                return None
            act = settings.get("hidden_act", "gelu")
            config = FamilyConfig(kind, settings["vocab_size"], settings.get("hidden_size", 768),
                                  settings.get("num_hidden_layers", 12), settings.get("num_attention_heads", 12),
                                  settings.get("intermediate_size", 3072), settings.get("max_position_embeddings", 512),
                                  act, act if kind == "bert" else "gelu", settings.get("layer_norm_eps", 1e-12),
                                  settings.get("type_vocab_size", 2),
                                  settings.get("pad_token_id", 0 if kind == "bert" else 1),
                                  settings.get("tie_word_embeddings", True))
    except KeyError:
        return None
    sizes = (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
             config.intermediate_size, config.max_position_embeddings, config.type_vocab_size, config.pad_token_id)
    if not all(type(v) is int and v >= 0 for v in sizes) or min(sizes[:6]) < 1 \
            or (kind != "distilbert" and config.type_vocab_size < 1) \
            or config.hidden_size % config.num_attention_heads or not isinstance(config.hidden_act, str) \
            or not isinstance(config.head_act, str) or config.hidden_act not in _ACTIVATIONS \
            or not isinstance(config.layer_norm_eps, (int, float)) or config.pad_token_id >= config.vocab_size:
        return None
    return config


class _Linear(nn.Linear):
    def reset_parameters(self) -> None:
        """Made on the meta device and given the checkpoint's tensors: nothing to initialize. (An initializer on the
        meta device runs torch's Python reference kernels, which import torch._dynamo: a second and more.)"""


class _Embedding(nn.Embedding):
    reset_parameters = _Linear.reset_parameters


class _LayerNorm(nn.LayerNorm):
    reset_parameters = _Linear.reset_parameters


class _Node(nn.Module):
    """A module that only holds others, under transformers' names."""

    def __init__(self, /, **children: nn.Module | nn.Parameter):  # `/`: BERT names a child "self"
        super().__init__()
        for name, child in children.items():
            setattr(self, name, child)


def _norm(c: FamilyConfig) -> nn.LayerNorm:
    return _LayerNorm(c.hidden_size, eps=c.layer_norm_eps)


def _layer(c: FamilyConfig) -> nn.Module:
    h, inner = c.hidden_size, c.intermediate_size
    if c.model_type == "distilbert":
        return _Node(attention=_Node(q_lin=_Linear(h, h), k_lin=_Linear(h, h), v_lin=_Linear(h, h),
                                     out_lin=_Linear(h, h)),
                     sa_layer_norm=_norm(c), ffn=_Node(lin1=_Linear(h, inner), lin2=_Linear(inner, h)),
                     output_layer_norm=_norm(c))
    return _Node(attention=_Node(self=_Node(query=_Linear(h, h), key=_Linear(h, h), value=_Linear(h, h)),
                                 output=_Node(dense=_Linear(h, h), LayerNorm=_norm(c))),
                 intermediate=_Node(dense=_Linear(h, inner)),
                 output=_Node(dense=_Linear(inner, h), LayerNorm=_norm(c)))


class FamilyMaskedLM(nn.Module):
    """A masked LM of the family, called as transformers' is: `(input_ids, attention_mask)` for a padded batch, or,
    once `packed.pack`ed, one packed sequence with its documents' bounds (packed.forward). Its output's `logits` are
    the hidden states after the masked-LM transform: the decoder (`get_output_embeddings`) is the head's, which
    sparton applies."""

    _supports_attention_backend = True  # runs packed (packed.packs): its attention is `packed.attend`

    def __init__(self, config: FamilyConfig):
        super().__init__()
        self.config = c = config
        h = c.hidden_size
        embeddings = _Node(word_embeddings=_Embedding(c.vocab_size, h),
                           position_embeddings=_Embedding(c.max_position_embeddings, h), LayerNorm=_norm(c))
        if c.type_vocab_size:
            embeddings.token_type_embeddings = _Embedding(c.type_vocab_size, h)
        layers = _Node(layer=nn.ModuleList(_layer(c) for _ in range(c.num_hidden_layers)))
        decoder = _Linear(h, c.vocab_size)
        if c.model_type == "distilbert":
            self.distilbert = _Node(embeddings=embeddings, transformer=layers)
            self.vocab_transform, self.vocab_layer_norm, self.vocab_projector = _Linear(h, h), _norm(c), decoder
        elif c.model_type == "bert":
            self.bert = _Node(embeddings=embeddings, encoder=layers)
            self.cls = _Node(predictions=_Node(transform=_Node(dense=_Linear(h, h), LayerNorm=_norm(c)),
                                               decoder=decoder, bias=decoder.bias))
        else:
            self.roberta = _Node(embeddings=embeddings, encoder=layers)
            self.lm_head = _Node(dense=_Linear(h, h), layer_norm=_norm(c), decoder=decoder, bias=decoder.bias)
        self.packed = False

    @property
    def _body(self) -> nn.Module:
        return getattr(self, _PREFIX[self.config.model_type])

    @property
    def _layers(self) -> nn.ModuleList:
        body = self._body
        return body.transformer.layer if self.config.model_type == "distilbert" else body.encoder.layer

    def get_input_embeddings(self) -> nn.Embedding:
        return self._body.embeddings.word_embeddings

    def get_output_embeddings(self) -> nn.Module:
        c = self.config
        if c.model_type == "bert":
            return self.cls.predictions.decoder
        return self.vocab_projector if c.model_type == "distilbert" else self.lm_head.decoder

    def _transform(self, x: torch.Tensor) -> torch.Tensor:
        c, act = self.config, _ACTIVATIONS[self.config.head_act]
        if c.model_type == "bert":
            t = self.cls.predictions.transform
            return t.LayerNorm(act(t.dense(x)))
        if c.model_type == "distilbert":
            return self.vocab_layer_norm(act(self.vocab_transform(x)))
        return self.lm_head.layer_norm(act(self.lm_head.dense(x)))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                max_length_q: int | None = None, **_: object) -> SimpleNamespace:
        c = self.config
        if self.packed and cu_seq_lens_q is None:
            raise RuntimeError("a packed model was called without its documents' bounds: use packed.forward")
        if position_ids is None:
            position_ids = self._positions(input_ids)
        e = self._body.embeddings
        x = e.word_embeddings(input_ids)
        if c.type_vocab_size:  # added in transformers' order: in 16 bits the sum's rounding depends on it
            x = x + e.token_type_embeddings.weight[0]
        x = e.LayerNorm(x + e.position_embeddings(position_ids))
        if cu_seq_lens_q is not None:  # one packed sequence [1, T]: attention inside each document
            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                heads = (q.shape[1], c.num_attention_heads, -1)
                out = packed.attend(q[0].view(heads), k[0].view(heads), v[0].view(heads), cu_seq_lens_q,
                                    max_length_q, scale)
                return out.reshape(1, q.shape[1], -1)
        else:
            mask = (torch.ones_like(input_ids) if attention_mask is None else attention_mask).bool()[:, None, None, :]

            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                b, n = q.shape[:2]
                split = [t.view(b, n, c.num_attention_heads, -1).transpose(1, 2) for t in (q, k, v)]
                out = F.scaled_dot_product_attention(*split, attn_mask=mask, scale=scale)
                return out.transpose(1, 2).reshape(b, n, -1)
        scale = 1 / math.sqrt(c.hidden_size // c.num_attention_heads)
        act = _ACTIVATIONS[c.hidden_act]
        for layer in self._layers:
            if c.model_type == "distilbert":
                a = layer.attention
                x = layer.sa_layer_norm(a.out_lin(attend(a.q_lin(x), a.k_lin(x), a.v_lin(x))) + x)
                x = layer.output_layer_norm(layer.ffn.lin2(act(layer.ffn.lin1(x))) + x)
            else:
                s, o = layer.attention.self, layer.attention.output
                x = o.LayerNorm(o.dense(attend(s.query(x), s.key(x), s.value(x))) + x)
                x = layer.output.LayerNorm(layer.output.dense(act(layer.intermediate.dense(x))) + x)
        return SimpleNamespace(logits=self._transform(x))

    def _positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """A padded batch's position ids as the family computes them: RoBERTa's kind counts from the padding id + 1
        over tokens that are not the padding id (which keep it), the others count from 0."""
        if self.config.model_type in ("roberta", "xlm-roberta"):
            pad = self.config.pad_token_id
            counted = input_ids.ne(pad).int()
            return (torch.cumsum(counted, dim=1) * counted).long() + pad
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)


def load(settings: dict, state: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device = "cpu"
         ) -> FamilyMaskedLM | None:
    """The model of `settings` (its config.json) with the weights `state` in `dtype` on `device`, or None where this
    module does not run it or the weights do not fit it exactly (a name missing, a shape that differs). Each tensor
    goes to the device as it is and is converted there: `.to(device, dtype)` converts a host-to-GPU copy on the host,
    in torch's CPU threads, which at start-up wait for the cores the input's tokenizers hold
    (docs/performance/encode.md, "Start-up")."""
    config = family_config(settings)
    if config is None:
        return None
    with torch.device("meta"):
        model = FamilyMaskedLM(config)
    state = {k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
             for k, v in state.items()}  # the names of older checkpoints, as transformers reads them
    decoder = model.get_output_embeddings()
    params = dict(model.named_parameters())
    decoder_weight = next(name for name, p in params.items() if p is decoder.weight)
    bias = next(name for name, p in params.items() if p is decoder.bias)
    # the head's bias is saved under either of its two names, and where a checkpoint holds both, the decoder's is the
    # one its logits use (as transformers loads it); a decoder weight left out is the word embeddings'
    state[bias] = state.get(bias.replace(".bias", ".decoder.bias"), state.get(bias))
    tensors = {}
    for name, param in params.items():
        value = state.get(name)
        if value is None and name == decoder_weight and config.tie_word_embeddings:
            continue
        if value is None or value.shape != param.shape:
            return None
        tensors[name] = value
    for name, value in tensors.items():  # every tensor fits: only now to the device (one float32 tensor at a time)
        value = value.to(device)
        tensors[name] = value.to(dtype) if value.is_floating_point() else value
    model.load_state_dict(tensors, strict=False, assign=True)
    holder = model.get_submodule(bias.rsplit(".", 1)[0])
    decoder.bias = holder.bias  # one parameter under both names again, as in transformers
    if decoder_weight not in tensors:
        decoder.weight = model.get_input_embeddings().weight
    return model.eval()
