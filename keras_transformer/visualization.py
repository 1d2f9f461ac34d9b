"""Pictures: attention maps (every layer and head, tokens on the axes) and the
sinusoidal positional encoding. Needs matplotlib, which the `viz` extra
installs (`pip install 'attention-transformer-keras[viz]'`); a plain install
lacks it, and `require_matplotlib()` says so in one sentence."""

import os

import numpy as np

from keras_transformer.layers.position_encoding import sinusoidal_position_encoding

ATTENTION_KINDS = {
    "encoder_self": ("Encoder self-attention", "source", "source"),
    "decoder_self": ("Decoder masked self-attention", "target", "target"),
    "decoder_cross": ("Encoder-decoder attention", "target", "source"),
}


INSTALL_VIZ = "pip install 'attention-transformer-keras[viz]'"


class MatplotlibMissing(ImportError):
    """matplotlib cannot be imported; the message names the `viz` extra."""


def matplotlib_missing():
    """None when matplotlib imports, else one sentence saying what is missing
    and how to install it (the `viz` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        if e.name == "matplotlib":
            what = "matplotlib is not installed"
        else:  # installed, but something it needs is not
            what = f"matplotlib cannot be imported ({e})"
        return f"{what}; the pictures need it, from the viz extra: {INSTALL_VIZ}"
    return None


def require_matplotlib():
    """Raises `MatplotlibMissing` (an ImportError) when matplotlib cannot be
    imported, with `matplotlib_missing()`'s sentence."""
    missing = matplotlib_missing()
    if missing:
        raise MatplotlibMissing(missing, name="matplotlib")


def _pyplot():
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    return plt


def plot_attention(weights, query_tokens, key_tokens, title, path):
    """One figure: a grid of layers (rows) x heads (columns).

    Args:
        weights: list (one per layer) of `(heads, q_len, k_len)` arrays.
        query_tokens, key_tokens: labels of the rows and columns.
        title: figure title.
        path: PNG file to write.

    Returns: `path`.
    """
    weights = [np.asarray(w) for w in weights]
    layers, heads = len(weights), weights[0].shape[0]
    q_len, k_len = weights[0].shape[1:]
    if (q_len, k_len) != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"Attention maps are {q_len} x {k_len} but {len(query_tokens)} query and "
            f"{len(key_tokens)} key labels were given."
        )
    plt = _pyplot()
    cell = 0.28
    width = max(3.0, k_len * cell) * heads + 1
    height = max(3.0, q_len * cell) * layers + 1
    fig, axes = plt.subplots(layers, heads, figsize=(width, height), squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            ax.imshow(weights[layer][head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(k_len))
            ax.set_yticks(range(q_len))
            ax.set_xticklabels(key_tokens, rotation=90, fontsize=7)
            ax.set_yticklabels(query_tokens, fontsize=7)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_positional_encoding(length, d_model, path):
    """Heat map of the sinusoidal encoding, positions x channels (3.5)."""
    plt = _pyplot()
    encoding = np.asarray(sinusoidal_position_encoding(length, d_model))
    fig, ax = plt.subplots(figsize=(8, 4))
    image = ax.imshow(encoding, cmap="RdBu", aspect="auto", vmin=-1, vmax=1)
    ax.set_xlabel("channel (even: sin, odd: cos)")
    ax.set_ylabel("position")
    ax.set_title(f"Sinusoidal positional encoding, d_model = {d_model}")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_translation_attention(model, source_pieces, source_ids, target_pieces,
                               target_input_ids, output_dir, prefix="attention"):
    """All three attention kinds of one sentence pair, one PNG each.

    Args:
        model: a `Transformer`.
        source_pieces: labels of `source_ids` (with eos).
        source_ids: `(1, src_len)` ids.
        target_pieces: labels of `target_input_ids` (bos first).
        target_input_ids: `(1, tgt_len)`: bos + the translation.
        output_dir: where the PNGs go.

    Returns: `{kind: path}`.
    """
    maps = model.attention_weights(source_ids, target_input_ids)
    labels = {"source": source_pieces, "target": target_pieces}
    paths = {}
    for kind, (title, rows, columns) in ATTENTION_KINDS.items():
        per_layer = [np.asarray(w)[0] for w in maps[kind]]
        paths[kind] = plot_attention(
            per_layer, labels[rows], labels[columns], title,
            os.path.join(output_dir, f"{prefix}_{kind}.png"),
        )
    return paths
