// The API's view of the stories260K fixture (coordinator/api/generation.h
// ModelInfo), for the request-parsing suites: its tokenizer, chat family and
// stop tokens, and the context the suite wants. Header-only: only suites that
// link the coordinator include it.
#pragma once

#include <cstdint>

#include "coordinator/api/generation.h"
#include "chat/family.h"
#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"
#include "tests/test_util.h"

namespace baton::test {

inline ModelInfo stories_model_info(int64_t n_ctx) {
  GgufFile f = GgufFile::open(model_path("stories260K.gguf"));
  ModelInfo m;
  m.id = "stories260K";
  m.n_ctx = n_ctx;
  m.n_vocab = 512;
  m.tokenizer = Tokenizer::from_gguf(f);
  m.chat_family = detect_chat_family(f);
  m.chat_stop_tokens = chat_stop_tokens(m.chat_family, *m.tokenizer);
  m.chat_stop_strings = chat_stop_strings(m.chat_family);
  return m;
}

}  // namespace baton::test
