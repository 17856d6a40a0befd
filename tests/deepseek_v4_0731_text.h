// The 0731 encoder's texts the tests expect (written from encoding_dsv4.py's
// REASONING_EFFORT_PROMPTS, not from the built-in template): one copy for
// every suite that checks a 0731 prompt.
#pragma once

#include <string>

namespace baton::test {

inline const std::string kDs4Bos = "<｜begin▁of▁sentence｜>";
inline const std::string kDs4EffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
inline const std::string kDs4EffortMax =
    "Reasoning Effort: Beyond maximum \xE2\x80\x94 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose "
    "the problem into its most fundamental components, trace every causal chain to its root, and resolve the "
    "underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

}  // namespace baton::test
