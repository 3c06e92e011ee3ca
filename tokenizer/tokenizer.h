/* tokenizer/ — byte-level BPE (GPT-2 style): load a vocabulary from a
 * Hugging Face tokenizer.json, GPT-2's encoder.json + vocab.bpe or a
 * tiktoken rank file; train one from text; encode and decode.
 *
 * Pre-tokenisation is a regex through PCRE2 (JIT where available) in UTF
 * mode with PCRE2_MATCH_INVALID_UTF: bytes that are not valid UTF-8 never
 * match and are encoded as pieces of their own, so any byte string round
 * trips. The regex is a named pattern (gpt2, cl100k, o200k, llama3) or the
 * Split regex a tokenizer.json declares; GPT-2's unless told otherwise.
 * Special tokens (<|endoftext|>, added tokens) are split out before the
 * regex. Depends on core only. */
#ifndef LOCO_TOKENIZER_H
#define LOCO_TOKENIZER_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

#define LOCO_TOK_EOT "<|endoftext|>"
/* Llama 3's end of a document (its <|eot_id|> ends a chat turn). */
#define LOCO_TOK_LLAMA3_EOT "<|end_of_text|>"

/* GPT-2's pre-tokenisation pattern. */
#define LOCO_TOK_GPT2_PATTERN                                                                      \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* ---- named pre-tokenisation patterns (issue 28, "Model families") ----
 * Each is tiktoken's pat_str verbatim (tiktoken_ext/openai_public.py, tiktoken
 * 0.14), in the syntax tiktoken's fancy-regex and PCRE2 share: possessive
 * ?+ ++ *+ {1,3}+, \p{..} classes, (?i:..) groups, (?!..) look-ahead. With
 * PCRE2_UCP, \s is Unicode's White_Space as in Rust's regex (U+0085 NEL
 * too) but for U+180E, a space to PCRE2 10.42 only; $ is compiled as the
 * end of the text alone (PCRE2_DOLLAR_ENDONLY), as in Rust. */
/* cl100k_base (GPT-3.5/4): contractions in any case, letters with one
 * leading non-letter, digits in runs of at most 3. */
#define LOCO_TOK_CL100K_PATTERN                                                                    \
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| "                         \
    "?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s"
/* o200k_base (GPT-4o): words split at case changes (upper-case letters
 * then lower-case ones, marks joining either), contractions attached. */
#define LOCO_TOK_O200K_PATTERN                                                                     \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*"                                  \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                 \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"                                  \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                 \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Llama 3 (meta-llama/llama3 llama/tokenizer.py; the Split regex of its
 * tokenizer.json): tiktoken's first cl100k pat_str. It splits as
 * LOCO_TOK_CL100K_PATTERN but for white space with a newline at the end of
 * a text: "\n  " is one piece there under cl100k, two under llama3. */
#define LOCO_TOK_LLAMA3_PATTERN                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LOCO_TOK_PATTERN_NAMES "gpt2, cl100k, o200k, llama3"

typedef struct loco_tok loco_tok;

/* Loaders. Each returns a tokenizer in *out (caller destroys), or
 * LOCO_EPROTO / LOCO_EINVAL with "FILE: where: what was expected" (LOCO_EIO
 * when unreadable). Every vocabulary must hold all 256 single bytes; merges
 * must name tokens of the vocabulary and produce one; ids must be unique.
 *
 * A tokenizer.json's pre_tokenizer decides its pattern: ByteLevel (use_regex
 * true) alone, or none, is GPT-2's; a Split {"Regex": R} (behavior
 * Isolated), alone or in a Sequence with a ByteLevel of use_regex false, is
 * R (a named pattern when R is one, else "custom"). Refused (LOCO_EPROTO):
 * no regex at all (ByteLevel use_regex false alone), two regexes, a String
 * Split, other behaviors or invert, add_prefix_space true, other types.
 * model.ignore_merges true: a piece that is a token of the vocabulary is
 * that token without merging (as Hugging Face and tiktoken do). */
int loco_tok_load_hf(loco_tok **out, const char *tokenizer_json);
int loco_tok_load_gpt2(loco_tok **out, const char *encoder_json, const char *vocab_bpe);
/* tiktoken: "BASE64 RANK" per line; merges are derived from the ranks
 * (as Hugging Face's converter does) and <|endoftext|> is added as the id
 * after the largest rank. GPT-2's pattern. */
int loco_tok_load_tiktoken(loco_tok **out, const char *path);
/* By name: PATH ending in .json holding "model" -> tokenizer.json;
 * "ENCODER_JSON,VOCAB_BPE" -> GPT-2 files; anything else -> tiktoken. */
int loco_tok_load(loco_tok **out, const char *spec);
/* As loco_tok_load with a named pattern (LOCO_TOK_PATTERN_NAMES). NULL, ""
 * or "auto": what the file declares (GPT-2's for tiktoken and GPT-2 files).
 * A tiktoken file read under cl100k or o200k that holds exactly OpenAI's
 * ranks 0..100255 / 0..199997 gets tiktoken's special tokens of that
 * encoding (cl100k: <|endoftext|> 100257, <|fim_prefix|> 100258,
 * <|fim_middle|> 100259, <|fim_suffix|> 100260, <|endofprompt|> 100276;
 * o200k: <|endoftext|> 199999, <|endofprompt|> 200018) in place of
 * <|endoftext|> after the largest rank. Under llama3 a file of exactly
 * ranks 0..127999 (Llama 3's tokenizer.model) gets Llama 3.1's 256
 * specials, 128256 ids: <|begin_of_text|> 128000, <|end_of_text|> 128001,
 * <|finetune_right_pad_id|> 128004, <|start_header_id|> 128006,
 * <|end_header_id|> 128007, <|eom_id|> 128008, <|eot_id|> 128009,
 * <|python_tag|> 128010 and <|reserved_special_token_K|> on the others
 * (K = 0 at 128002, 1, 2 at 128005, 3 at 128011, ... 247 at 128255). An
 * unknown name: LOCO_EINVAL naming the known ones. */
int loco_tok_load_pattern(loco_tok **out, const char *spec, const char *pattern);
/* The regex of a named pattern (as LOCO_TOK_*_PATTERN), or NULL. */
const char *loco_tok_pattern_regex(const char *name);
/* Makes t split with the named pattern from now on (special tokens stay as
 * loaded); NULL, "" or "auto" leaves t as it is. LOCO_EINVAL for an unknown
 * name. Not while another thread encodes with t. */
int loco_tok_set_pattern(loco_tok *t, const char *name);
/* The name of t's pattern: one of LOCO_TOK_PATTERN_NAMES, or "custom" for
 * a tokenizer.json's own regex (encode_parallel then runs one chunk). */
const char *loco_tok_pattern_name(const loco_tok *t);
void loco_tok_destroy(loco_tok *t); /* accepts NULL */

/* Trains a byte-level BPE of vocab_size ids from text: ids 0..255 are the
 * bytes, then one id per merge, the last id is <|endoftext|>. Pieces are
 * the named pattern's (LOCO_TOK_PATTERN_NAMES; NULL, "" or "auto": GPT-2's),
 * which the tokenizer keeps (and loco_tok_save_hf writes); each step merges
 * the most frequent adjacent pair (ties: the smaller left id, then the
 * smaller right id), so the result is a function of the text and the
 * pattern alone. vocab_size must be in 258..1<<24. */
int loco_tok_train(loco_tok **out, const uint8_t *text, size_t len, int vocab_size,
                   const char *pattern);
/* Writes t as a Hugging Face tokenizer.json (model BPE, ByteLevel
 * pre-tokenizer and decoder, added_tokens with the special tokens). A
 * pattern other than GPT-2's is written as a Split of its regex before a
 * ByteLevel of use_regex false, so loading the file gives it back. */
int loco_tok_save_hf(const loco_tok *t, const char *path);

int loco_tok_vocab_size(const loco_tok *t); /* largest id + 1 */
int loco_tok_num_merges(const loco_tok *t);
/* Id of a special token by its text, or -1. */
int loco_tok_special_id(const loco_tok *t, const char *text);
/* The special token that separates documents: <|endoftext|>, else Llama 3's
 * <|end_of_text|> (LOCO_TOK_LLAMA3_EOT); -1 when t has neither. */
int loco_tok_eot_id(const loco_tok *t);
/* Bytes of one id (NULL with *len 0 for an id outside the vocabulary). */
const uint8_t *loco_tok_token_bytes(const loco_tok *t, int id, size_t *len);

/* Encodes text into a fresh array *ids (loco_free) of *n ids. Thread-safe
 * on a shared tokenizer (each call keeps its own piece cache). */
int loco_tok_encode(const loco_tok *t, const uint8_t *text, size_t len, int32_t **ids, size_t *n);
/* As above over `nthreads` threads (<= 0: OpenMP's default): the text is cut
 * into chunks of about chunk_bytes at places where each named pattern always
 * starts a piece (after a single newline, before an ASCII letter or digit),
 * so the ids equal loco_tok_encode's whatever the thread count. A "custom"
 * pattern is not cut: one chunk. progress (may be NULL) is
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
/* One document: the separator (loco_tok_eot_id) then the ids of text (as
 * loco_tok_encode_parallel, whose arguments these are), the way llm.c's
 * preparation scripts put one before every document. A fresh array *ids
 * (loco_free) of *n ids; LOCO_EINVAL naming `what` when t has no
 * separator. */
int loco_tok_encode_document(const loco_tok *t, const char *what, const uint8_t *text, size_t len,
                             size_t chunk_bytes, int nthreads, loco_tok_progress_fn progress,
                             void *arg, int32_t **ids, size_t *n);
/* lens[id] = bytes of text id stands for, for ids 0..n-1: its bytes, 0 for
 * the separator (loco_tok_eot_id: no text) and for ids outside the vocabulary
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
