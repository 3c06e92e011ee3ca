/* tokenizer/ — byte-level BPE (GPT-2 style): load a vocabulary from a
 * Hugging Face tokenizer.json, GPT-2's encoder.json + vocab.bpe or a
 * tiktoken rank file; train one from text; encode and decode.
 *
 * Pre-tokenisation is GPT-2's regex through PCRE2 (JIT where available) in
 * UTF mode with PCRE2_MATCH_INVALID_UTF: bytes that are not valid UTF-8 never
 * match and are encoded as pieces of their own, so any byte string round
 * trips. Special tokens (<|endoftext|>, added tokens) are split out before
 * the regex. Depends on core only. */
#ifndef LOCO_TOKENIZER_H
#define LOCO_TOKENIZER_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

#define LOCO_TOK_EOT "<|endoftext|>"

/* GPT-2's pre-tokenisation pattern. */
#define LOCO_TOK_GPT2_PATTERN                                                                      \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct loco_tok loco_tok;

/* Loaders. Each returns a tokenizer in *out (caller destroys), or
 * LOCO_EPROTO / LOCO_EINVAL with "FILE: where: what was expected" (LOCO_EIO
 * when unreadable). Every vocabulary must hold all 256 single bytes; merges
 * must name tokens of the vocabulary and produce one; ids must be unique. */
int loco_tok_load_hf(loco_tok **out, const char *tokenizer_json);
int loco_tok_load_gpt2(loco_tok **out, const char *encoder_json, const char *vocab_bpe);
/* tiktoken: "BASE64 RANK" per line; merges are derived from the ranks
 * (as Hugging Face's converter does) and <|endoftext|> is added as the id
 * after the largest rank. */
int loco_tok_load_tiktoken(loco_tok **out, const char *path);
/* By name: PATH ending in .json holding "model" -> tokenizer.json;
 * "ENCODER_JSON,VOCAB_BPE" -> GPT-2 files; anything else -> tiktoken. */
int loco_tok_load(loco_tok **out, const char *spec);
void loco_tok_destroy(loco_tok *t); /* accepts NULL */

/* Trains a byte-level BPE of vocab_size ids from text: ids 0..255 are the
 * bytes, then one id per merge, the last id is <|endoftext|>. Pieces are the
 * GPT-2 regex's; each step merges the most frequent adjacent pair (ties: the
 * smaller left id, then the smaller right id), so the result is a function
 * of the text alone. vocab_size must be in 258..1<<24. */
int loco_tok_train(loco_tok **out, const uint8_t *text, size_t len, int vocab_size);
/* Writes t as a Hugging Face tokenizer.json (model BPE, ByteLevel
 * pre-tokenizer and decoder, added_tokens with the special tokens). */
int loco_tok_save_hf(const loco_tok *t, const char *path);

int loco_tok_vocab_size(const loco_tok *t); /* largest id + 1 */
int loco_tok_num_merges(const loco_tok *t);
/* Id of a special token by its text, or -1. */
int loco_tok_special_id(const loco_tok *t, const char *text);
/* Bytes of one id (NULL with *len 0 for an id outside the vocabulary). */
const uint8_t *loco_tok_token_bytes(const loco_tok *t, int id, size_t *len);

/* Encodes text into a fresh array *ids (loco_free) of *n ids. Thread-safe
 * on a shared tokenizer (each call keeps its own piece cache). */
int loco_tok_encode(const loco_tok *t, const uint8_t *text, size_t len, int32_t **ids, size_t *n);
/* As above over `nthreads` threads (<= 0: OpenMP's default): the text is cut
 * into chunks of about chunk_bytes at places where the regex always starts a
 * piece (after a newline, before a non-space), so the ids equal
 * loco_tok_encode's whatever the thread count. progress (may be NULL) is
 * called from one thread at a time with the bytes done so far. */
typedef void (*loco_tok_progress_fn)(size_t done, size_t total, void *arg);
int loco_tok_encode_parallel(const loco_tok *t, const uint8_t *text, size_t len, size_t chunk_bytes,
                             int nthreads, loco_tok_progress_fn progress, void *arg, int32_t **ids,
                             size_t *n);
/* Decodes ids into a fresh NUL-terminated buffer *text (loco_free) of *len
 * bytes. LOCO_EINVAL names the first id outside the vocabulary. */
int loco_tok_decode(const loco_tok *t, const int32_t *ids, size_t n, uint8_t **text, size_t *len);

/* Ids written as decimal numbers separated by spaces, tabs or newlines
 * (text need not be NUL-terminated) into a fresh array *ids (loco_free) of
 * *n ids. LOCO_EINVAL "WHAT: byte B: expected a token id" at the first
 * thing that is not an id in 0..INT32_MAX. */
int loco_tok_parse_ids(const char *text, size_t len, const char *what, int32_t **ids, size_t *n);
/* One document: <|endoftext|> then the ids of text (as
 * loco_tok_encode_parallel, whose arguments these are), the way llm.c's
 * preparation scripts put one before every document. A fresh array *ids
 * (loco_free) of *n ids; LOCO_EINVAL naming `what` when t has no
 * <|endoftext|>. */
int loco_tok_encode_document(const loco_tok *t, const char *what, const uint8_t *text, size_t len,
                             size_t chunk_bytes, int nthreads, loco_tok_progress_fn progress,
                             void *arg, int32_t **ids, size_t *n);
/* lens[id] = bytes of text id stands for, for ids 0..n-1: its bytes, 0 for
 * <|endoftext|> (a separator, no text) and for ids outside the vocabulary
 * (n may exceed loco_tok_vocab_size). */
int loco_tok_text_bytes(const loco_tok *t, int n, uint32_t *lens);
/* The tokenizer.json at path when there is one (*out NULL, 0 when there
 * is no file: byte-level), checked to have at most max_vocab ids
 * (LOCO_EINVAL naming path otherwise); load errors pass through. */
int loco_tok_load_optional(loco_tok **out, const char *path, int max_vocab);

/* The regex split alone (no merges), for benchmarks: *npieces gets the
 * number of pieces of text. */
int loco_tok_split_count(const loco_tok *t, const uint8_t *text, size_t len, size_t *npieces);

#endif /* LOCO_TOKENIZER_H */
