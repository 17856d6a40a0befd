// Which transport carries the boundary activations of each stage link
// (stage i -> i+1): the coordinator decides from what the two workers said
// in HELLO (docs/PROTOCOL.md, "Link negotiation"). Pure functions, so the
// rules are tested without a GPU.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "net/protocol.h"

namespace baton::net {

// --link: auto picks NCCL where both ends can use it; tcp never uses NCCL;
// nccl asks for NCCL on every link (the cluster refuses to start when a link
// cannot have it).
enum class LinkMode : uint8_t { automatic, tcp, nccl };

std::optional<LinkMode> link_mode_from_name(std::string_view name);  // "auto", "tcp", "nccl"
std::string_view link_mode_name(LinkMode m);
std::string_view link_kind_name(LinkKind k);  // "tcp", "nccl"

struct LinkChoice {
  LinkKind kind = LinkKind::tcp;
  std::string reason;  // why TCP; for NCCL, what it runs over
};

// The choice for the link from `from` (stage i) to `to` (stage i+1). Names
// in the reason are the workers' node names.
LinkChoice choose_link(const Hello& from, const Hello& to, LinkMode mode);

// "hostname/boot-id": the same for every process of one running machine
// (containers of one host share the boot id), different across hosts.
std::string local_host_id();

}  // namespace baton::net
