"""Model FLOP counts for the Transformer, to turn tokens/s into a fraction of
the machine's matmul peak. Counts multiply-adds as 2 FLOPs and only the
matrix products (what dominates; softmax, norms and elementwise ops are left
out), as model-FLOP-utilisation figures usually do."""


def forward_flops(config, batch, source_length, target_length):
    """FLOPs of one forward pass over `batch` pairs of the given lengths."""
    d, f, s, t = config.d_model, config.d_ff, source_length, target_length
    encoder_layer = 8 * s * d * d + 4 * s * s * d + 4 * s * d * f
    decoder_layer = (
        8 * t * d * d + 4 * t * t * d  # masked self-attention
        + 4 * t * d * d + 4 * s * d * d + 4 * t * s * d  # encoder-decoder attention
        + 4 * t * d * f  # feed-forward
    )
    projection = 2 * t * d * config.output_vocab_size
    per_pair = (config.num_layers * encoder_layer
                + config.decoder_layers * decoder_layer + projection)
    return batch * per_pair


def training_flops(config, batch, source_length, target_length):
    """Forward + backward (the backward pass costs about twice the forward)."""
    return 3 * forward_flops(config, batch, source_length, target_length)
