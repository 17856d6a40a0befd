#include "net/link_choice.h"

#include <unistd.h>

#include <fstream>

#include "net/log.h"

namespace baton::net {

std::optional<LinkMode> link_mode_from_name(std::string_view name) {
  if (name == "auto") return LinkMode::automatic;
  if (name == "tcp") return LinkMode::tcp;
  if (name == "nccl") return LinkMode::nccl;
  return std::nullopt;
}

std::string_view link_mode_name(LinkMode m) {
  switch (m) {
    case LinkMode::automatic:
      return "auto";
    case LinkMode::tcp:
      return "tcp";
    case LinkMode::nccl:
      return "nccl";
  }
  return "auto";
}

std::string_view link_kind_name(LinkKind k) { return k == LinkKind::nccl ? "nccl" : "tcp"; }

namespace {

std::string version_text(uint32_t code) {
  // NCCL_VERSION(X, Y, Z) is X*10000 + Y*100 + Z since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

std::string device_label(const Capabilities& c) {
  return printable(c.pci_bus_id.empty() ? c.device_uuid : c.pci_bus_id, 64);
}

// Why this worker cannot open an NCCL link at all, or "".
std::string no_nccl(const Hello& h) {
  const std::string name = printable(h.node_name);
  // caps.nccl is the worker's own word that it can (a CUDA stage in a build
  // with NCCL and a device); the backend only explains a "no".
  if (!h.caps.nccl) {
    if (h.caps.backend != Backend::cuda) return name + " runs on the CPU";
    return name + " has no NCCL (the build has none, or no CUDA device)";
  }
  if (h.caps.host_id.empty()) return name + " did not say which host it runs on";
  return "";
}

}  // namespace

LinkChoice choose_link(const Hello& from, const Hello& to, LinkMode mode) {
  auto tcp = [](std::string why) { return LinkChoice{LinkKind::tcp, std::move(why)}; };
  if (mode == LinkMode::tcp) return tcp("--link tcp");
  for (const Hello* h : {&from, &to}) {
    if (std::string why = no_nccl(*h); !why.empty()) return tcp(why);
  }
  if (from.caps.nccl_version != to.caps.nccl_version) {
    return tcp("NCCL versions differ (" + version_text(from.caps.nccl_version) + " on " + printable(from.node_name) +
               ", " + version_text(to.caps.nccl_version) + " on " + printable(to.node_name) + ")");
  }
  if (from.caps.host_id == to.caps.host_id) {
    // NCCL refuses two ranks of one communicator on one device.
    if (!from.caps.device_uuid.empty() && from.caps.device_uuid == to.caps.device_uuid) {
      return tcp("both stages use the same GPU (" + printable(from.caps.device_uuid) + ")");
    }
    return {LinkKind::nccl, "same host, GPU " + device_label(from.caps) + " -> " + device_label(to.caps)};
  }
  // Across hosts NCCL is only worth it over RDMA; its socket transport is
  // no better than our own TCP link.
  if (!from.caps.nccl_net || !to.caps.nccl_net) {
    const std::string name = printable((from.caps.nccl_net ? to : from).node_name);
    return tcp("different hosts and no RDMA network for NCCL on " + name);
  }
  return {LinkKind::nccl, "different hosts, NCCL over RDMA"};
}

std::string local_host_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  if (host[0] == '\0' && boot.empty()) return "";
  return std::string(host) + "/" + boot;
}

}  // namespace baton::net
