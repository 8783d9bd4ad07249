"""Test scaffolding (not Regolith): a tiny random Llama and a locally trained byte-level BPE
tokenizer, saved as ``transformers`` saves a model (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``), so that vLLM serves it with no network.

The weights are random (fixed seed): the output is meaningless text, but it is deterministic,
which is all the end-to-end test needs.
"""

from __future__ import annotations

from pathlib import Path

# A small built-in corpus for the tokenizer (any text works; byte-level BPE covers every byte).
CORPUS = """\
Regolith is a distributed key-value store for the KV cache of large language models.
Each node runs a sidecar that owns a segment of memory; a small replicated metadata service
decides where every object lives. Clients talk to the local sidecar over a Unix socket and
move bytes between nodes over TCP or RDMA. LMCache splits a prompt into chunks of tokens,
hashes each chunk together with its prefix, and stores the keys and values of every layer
under that hash. When the same prefix comes back, even in another process or on another
machine, the engine looks the chunks up, loads them into its paged cache and skips the
prefill of those tokens. The quick brown fox jumps over the lazy dog. Pack my box with five
dozen liquor jugs. How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
The five boxing wizards jump quickly. 0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ?
"""

VOCAB_SIZE = 512


def _corpus():
    lines = CORPUS.splitlines()
    for i in range(20):
        for j, line in enumerate(lines):
            yield f"{i} {j} {line}"


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", model_max_length=65536
    )
    fast.save_pretrained(str(out))
    return fast


def build(out: Path, *, seed: int = 0, max_positions: int = 65536) -> Path:
    """Writes the tokenizer and a random 2-layer Llama (hidden 256) into `out`; returns `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: head_dim 64, 2 KV heads
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
        # Larger than Llama's 0.02 so the random model's next-token distribution is far from
        # uniform: its greedy choice is then stable, and wrong KV visibly moves it.
        initializer_range=0.1,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    return out


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1])))
