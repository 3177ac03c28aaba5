"""An RNN encoder-decoder, the kind of model the Transformer replaced (for comparisons).

With ``attention="luong"`` (Luong et al., 2015, global attention, "general" score)::

    H_s = EncoderRNN(embed(src))                          (B, S, Hd) every source state
    H_t = DecoderRNN(embed(tgt_in), initial state = the encoder's last state)   (B, T, Hd)
    a_t = softmax_s(h_t W_a h_s^T)                         (B, T, S), padding masked
    c_t = sum_s a_ts h_s;   h~_t = tanh(W_c [c_t; h_t]);   logits = h~_t W_out

without input feeding, so in training the decoder RNN runs over the whole target in one
call. With ``attention=None`` it is the plain sequence-to-sequence model of Sutskever et
al. (2014): the encoder's last state is all the decoder knows of the source. ``cell``
picks ``torch.nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` (tanh, the "vanilla" RNN).

Shapes are batch-first like the Transformer's: src (B, S), tgt_in (B, T) -> (B, T, V).
Token ids follow the Transformer's defaults: pad 0, bos 1, eos 2.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}
ATTENTIONS = ("luong", None)


class RNNSeq2Seq(nn.Module):
    """Encoder-decoder on torch's recurrent layers, optionally with Luong attention.

    Args:
        vocab_size: one vocabulary for source and target (V).
        d_emb: embedding size.
        d_hidden: recurrent state size (Hd).
        n_layers: stacked recurrent layers in the encoder and in the decoder.
        cell: "lstm", "gru" or "rnn" (tanh).
        attention: "luong" or None.
    """

    def __init__(self, vocab_size: int, d_emb: int = 64, d_hidden: int = 128, n_layers: int = 1,
                 cell: str = "lstm", attention: str | None = "luong", dropout: float = 0.0,
                 pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> None:
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {sorted(CELLS)}, got {cell!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        self.cell, self.attention = cell, attention
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.src_embed = nn.Embedding(vocab_size, d_emb, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(vocab_size, d_emb, padding_idx=pad_id)
        rnn = CELLS[cell]
        drop = dropout if n_layers > 1 else 0.0
        self.encoder = rnn(d_emb, d_hidden, n_layers, batch_first=True, dropout=drop)
        self.decoder = rnn(d_emb, d_hidden, n_layers, batch_first=True, dropout=drop)
        if attention == "luong":
            self.attn_proj = nn.Linear(d_hidden, d_hidden, bias=False)  # W_a
            self.combine = nn.Linear(2 * d_hidden, d_hidden, bias=False)  # W_c
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_hidden, vocab_size)

    def encode(self, src: Tensor) -> tuple[Tensor, object]:
        """(B, S) ids -> every state (B, S, Hd) and the last state of each sentence
        (padding skipped): (n_layers, B, Hd), a pair of them for an LSTM."""
        lengths = (src != self.pad_id).sum(dim=1).clamp(min=1)
        x = self.dropout(self.src_embed(src))  # (B, S, E)
        if bool((lengths == src.size(1)).all()):  # no padding: skip the packing
            states, last = self.encoder(x)
            return states, last
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, last = self.encoder(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=src.size(1))
        return states, last

    def decode(self, tgt_in: Tensor, state, memory: Tensor, src_mask: Tensor) -> tuple[Tensor, object]:
        """Run the decoder over ``tgt_in`` (B, T) from ``state``; ``memory`` (B, S, Hd) and
        ``src_mask`` (B, S) (True = real token) feed the attention. Returns logits (B, T, V)
        and the state after the last position."""
        h, state = self.decoder(self.dropout(self.tgt_embed(tgt_in)), state)  # (B, T, Hd)
        if self.attention == "luong":
            scores = self.attn_proj(h) @ memory.transpose(1, 2)  # (B, T, S)
            scores = scores.masked_fill(~src_mask[:, None, :], torch.finfo(scores.dtype).min)
            context = scores.softmax(dim=-1) @ memory  # (B, T, Hd)
            h = torch.tanh(self.combine(torch.cat([context, h], dim=-1)))
        return self.out(self.dropout(h)), state

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: (B, S), (B, T) -> (B, T, V) logits."""
        memory, state = self.encode(src)
        logits, _ = self.decode(tgt_in, state, memory, src != self.pad_id)
        return logits

    @torch.no_grad()
    def greedy(self, src: Tensor, max_len: int = 50) -> list[list[int]]:
        """The most probable token at every step, one state update per step; each
        sentence's ids without BOS, up to and without EOS."""
        memory, state = self.encode(src)
        mask = src != self.pad_id
        last = torch.full((src.size(0), 1), self.bos_id, dtype=torch.long, device=src.device)
        out = []
        for _ in range(max_len):
            logits, state = self.decode(last, state, memory, mask)
            last = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            out.append(last)
        ids = torch.cat(out, dim=1).tolist()
        return [row[: row.index(self.eos_id)] if self.eos_id in row else row for row in ids]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def recurrent_parameters(d_in: int, d_hidden: int, n_layers: int, cell: str) -> int:
    """Weights and biases of one torch recurrent stack (gates: LSTM 4, GRU 3, RNN 1)."""
    gates = {"lstm": 4, "gru": 3, "rnn": 1}[cell]
    first = gates * (d_hidden * (d_in + d_hidden) + 2 * d_hidden)
    rest = gates * (d_hidden * (2 * d_hidden) + 2 * d_hidden)
    return first + (n_layers - 1) * rest


def hidden_size_for(budget: int, d_emb: int, n_layers: int, cell: str, attention: str | None) -> int:
    """The largest ``d_hidden`` whose non-embedding parameters (encoder, decoder, attention;
    not the embeddings or the output layer) stay within ``budget``: for size-matched comparisons."""

    def cost(h: int) -> int:
        attn = 3 * h * h if attention == "luong" else 0
        return 2 * recurrent_parameters(d_emb, h, n_layers, cell) + attn

    h = 1
    while cost(h + 1) <= budget:
        h += 1
    return h
