"""Ready-made score_mod / mask_mod functions (plain Python: they work in tileattn.flex_attention and in torch's).

mask_mod(b, h, q_idx, kv_idx) -> bool; score_mod(score, b, h, q_idx, kv_idx) -> score. Factories take their
parameters and return the function; pass mask_mods to create_block_mask
(torch.nn.attention.flex_attention.create_block_mask) and the block mask to flex_attention.
"""
from collections.abc import Callable, Sequence

import torch

_T = torch.Tensor
# mask_mod(b, h, q_idx, kv_idx) -> bool tensor (True: the key is visible)
MaskMod = Callable[[_T, _T, _T, _T], _T]
# score_mod(score, b, h, q_idx, kv_idx) -> the modified score
ScoreMod = Callable[[_T, _T, _T, _T, _T], _T]


def causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """Query i sees keys j <= i (top-left aligned, as torch's causal flex examples)."""
    return q_idx >= kv_idx


def sliding_window(window: int) -> MaskMod:
    """Causal attention to the last `window` keys and the query's own: i - window <= j <= i."""
    def sliding_window_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)
    return sliding_window_mask


def prefix_lm(prefix_len: int) -> MaskMod:
    """Keys j < prefix_len are visible to every query (bidirectional prefix), the rest causally."""
    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_len) | (q_idx >= kv_idx)
    return prefix_lm_mask


def document_ids_from_lengths(lengths: Sequence[int] | torch.Tensor,
                              device: torch.device | str | None = None) -> torch.Tensor:
    """int32 [sum(lengths)] document id of each token of a packed sequence of documents of `lengths`."""
    lengths = torch.as_tensor(lengths, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device, dtype=torch.int32),
                                   lengths.long())


def document(doc_ids: torch.Tensor, causal: bool = False) -> MaskMod:
    """Tokens see tokens of their own document only (doc_ids: int [S], or [B, S] per batch); with causal, only
    earlier ones."""
    if doc_ids.dim() == 1:
        def document_mask(b, h, q_idx, kv_idx):
            return doc_ids[q_idx] == doc_ids[kv_idx]
    else:
        def document_mask(b, h, q_idx, kv_idx):
            return doc_ids[b, q_idx] == doc_ids[b, kv_idx]
    if not causal:
        return document_mask

    def causal_document_mask(b, h, q_idx, kv_idx):
        return document_mask(b, h, q_idx, kv_idx) & (q_idx >= kv_idx)
    return causal_document_mask


def alibi_slopes(num_heads: int, device: torch.device | str | None = None) -> torch.Tensor:
    """float32 [num_heads] ALiBi slopes 2 ** (-8 (h + 1) / num_heads) (the paper's, for any head count)."""
    return torch.exp2(-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float32, device=device) / num_heads)


def alibi(slopes: torch.Tensor) -> ScoreMod:
    """score + slopes[h] * (kv_idx - q_idx): a linear penalty on distance (slopes: float32 [H])."""
    def alibi_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return alibi_bias


def tanh_softcap(cap: float) -> ScoreMod:
    """cap * tanh(score / cap) (Gemma 2, Grok)."""
    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return softcap


def relative_position_bias(table: torch.Tensor, max_distance: int) -> ScoreMod:
    """score + table[h, clamp(kv_idx - q_idx, -max_distance, max_distance) + max_distance] for a learned bias
    table float32 [H, 2 * max_distance + 1]."""
    def rel_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, torch.clamp(kv_idx - q_idx, -max_distance, max_distance) + max_distance]
    return rel_bias


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    """A mask_mod true where all of `mask_mods` are."""
    def and_mask(b, h, q_idx, kv_idx):
        result = mask_mods[0](b, h, q_idx, kv_idx)
        for m in mask_mods[1:]:
            result = result & m(b, h, q_idx, kv_idx)
        return result
    return and_mask


def or_masks(*mask_mods: MaskMod) -> MaskMod:
    """A mask_mod true where any of `mask_mods` is."""
    def or_mask(b, h, q_idx, kv_idx):
        result = mask_mods[0](b, h, q_idx, kv_idx)
        for m in mask_mods[1:]:
            result = result | m(b, h, q_idx, kv_idx)
        return result
    return or_mask


def compose_scores(*score_mods: ScoreMod) -> ScoreMod:
    """A score_mod applying `score_mods` in order (e.g. ALiBi then softcap)."""
    def composed(score, b, h, q_idx, kv_idx):
        for m in score_mods:
            score = m(score, b, h, q_idx, kv_idx)
        return score
    return composed
