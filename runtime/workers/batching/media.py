"""Multimodal values in a batch: which keys hold media, which may be shared between repeated rows,
and which pairs of PackedTensors describe the same media and must line up row by row."""
from __future__ import annotations

from typing import Any, Mapping

from runtime.workers.batching.packed_tensor import PackedTensor

# Names as NeMo RL's nemo_rl.data.multimodal_utils spells them.
VLLM_MULTIMODAL_DATA_KEYS = frozenset({"vllm_images", "vllm_videos", "vllm_audios"})
NATIVE_MULTIMODAL_KEYS = frozenset({"vllm_content", *VLLM_MULTIMODAL_DATA_KEYS})
IMAGE_CONTENT_TYPES = frozenset({"input_image", "image", "image_url"})
VIDEO_CONTENT_TYPES = frozenset({"input_video", "video", "video_url"})
AUDIO_CONTENT_TYPES = frozenset({"input_audio", "audio", "audio_url"})
MULTIMODAL_CONTENT_TYPES = frozenset({*IMAGE_CONTENT_TYPES, *VIDEO_CONTENT_TYPES, *AUDIO_CONTENT_TYPES})

# (pixel key, key that describes each of its segments): both must give every row the same count.
COUPLED_MEDIA_KEYS = (
    ("pixel_values", "image_grid_thw"),
    ("pixel_values", "imgs_sizes"),
    ("pixel_values", "num_frames"),
    ("pixel_values_videos", "video_grid_thw"),
)
PIXEL_KEYS = frozenset({"pixel_values", "pixel_values_videos"})


def shared_media_memo(value: Any, in_media: bool = False) -> dict[int, Any]:
    """A deepcopy memo under which a copy of `value` shares its media with the original.

    PackedTensors found anywhere get provenance (enable_deduplication), so their copies share
    segments. Other leaves are shared only inside media: below a native multimodal key (vllm_*)
    or inside a content part whose "type" is an image, video or audio type. Lists, tuples and dicts
    are never in the memo, so every copy has its own containers and rows can diverge safely.
    """
    memo: dict[int, Any] = {}

    def walk(item: Any, media: bool) -> None:
        if isinstance(item, PackedTensor):
            item.enable_deduplication()
        elif isinstance(item, dict):
            typed = item.get("type") in MULTIMODAL_CONTENT_TYPES
            for key, child in item.items():
                walk(child, media or typed or key in NATIVE_MULTIMODAL_KEYS)
        elif isinstance(item, (list, tuple)):
            for child in item:
                walk(child, media)
        elif media:
            memo[id(item)] = item

    walk(value, in_media)
    return memo


def check_coupled_media(data: Mapping[str, Any]) -> None:
    """ValueError when a pixel PackedTensor and its metadata PackedTensor disagree on how many
    segments each row has. Plain (never deduplicated, never indexed) pairs are not scanned."""
    for value_key, meta_key in COUPLED_MEDIA_KEYS:
        value, meta = data.get(value_key), data.get(meta_key)
        if not (isinstance(value, PackedTensor) and isinstance(meta, PackedTensor)):
            continue
        if value._is_plain() and meta._is_plain():
            continue
        got, expected = value.logical_segment_counts_by_row(), meta.logical_segment_counts_by_row()
        if got != expected:
            raise ValueError(f"Coupled multimodal keys must have the same ordered per-row segment counts, "
                             f"but {value_key!r} has {got} and {meta_key!r} has {expected}.")
