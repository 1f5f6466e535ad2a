"""The building blocks every family shares, each written once: norms, rotary (M-RoPE included),
attention (the q/k/v front end), mlp, moe, transformer (Whisper's pre-LayerNorm block), the
streaming codec decoder (`codec`), the configs these read (`configs`), and the Triton kernels beside
their torch fallbacks (fused_ops, moe_routed / moe_triton, paged_attention / triton_attention)."""
