"""The GPT-style decoder of issue 23's training rows, shared by torch_gpt.py and the model zoo's
`gpt` loop (zoo/loops.py) so that both train the same model: a token embedding, decoder blocks
(causal self-attention through SDPA, and an MLP), a final LayerNorm and a head without bias.

Imports torch: callers import this module only after their own check for torch and a GPU (their
exit 77) and after what has to be set before torch starts (loops.py's cuBLAS workspace). Building
a GPT draws its initial weights from torch's default generator, so its parameters are created in
one fixed order; the callers seed that generator first.
"""
import torch


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.heads = d // 64

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, t):
        x = self.emb(t)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))
