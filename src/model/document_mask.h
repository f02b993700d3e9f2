// Intra-document attention masking (data.document_masking): documents are packed into one token
// stream, each ending with EOS, and cut into instances regardless of document boundaries. With
// masking, a token attends only to earlier tokens of its own document, as OLMo-core does with the
// doc_lens of its NumpyFSLDataset(generate_doc_lengths=True) and varlen flash attention: a
// document runs up to and including an EOS, the next one starts after it, and an instance's last
// document ends at the instance's end (olmo_core.data.utils.get_document_lengths). With a BOS id
// (OLMo-core's bos_token_id, data.bos_id; tokenizers such as GPT-2's use one id for both) a
// document ends only at an EOS that a BOS follows in the same instance: each document starts with
// its BOS, and an EOS elsewhere (or one ending the instance) is a token like any other.
//
// RoPE keeps the positions 0..T-1 of the instance. OLMo-core restarts them at each document
// (intra-document RoPE); the attention scores are the same either way, because RoPE makes q_i.k_j
// depend on i - j only and masking keeps i and j in one document.
#pragma once

#include <cstdint>
#include <vector>

namespace moecore {

// tokens: [batch, seq] -> doc_start: [batch, seq], the position (within its row) of the first token
// of the document that holds each token. The attention row of query t keeps keys
// [doc_start[t], t]. bos_id -1: none.
void document_starts(const int32_t* tokens, int64_t batch, int64_t seq, int32_t eos_id,
                     int32_t bos_id, int32_t* doc_start);

// The document lengths of one row of `seq` tokens, in order (OLMo-core's get_document_lengths);
// they sum to seq.
std::vector<int64_t> document_lengths(const int32_t* row, int64_t seq, int32_t eos_id,
                                      int32_t bos_id = -1);

}  // namespace moecore
