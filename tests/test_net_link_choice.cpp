// The coordinator's choice of transport per stage link (net/link_choice.h):
// NCCL only where both workers can open it and can reach each other with it,
// TCP otherwise, with a reason that names the worker that stood in the way.
#include <gtest/gtest.h>

#include <string>

#include "net/link_choice.h"
#include "net/nccl_link.h"

namespace baton::net {
namespace {

Hello gpu_worker(const std::string& name, const std::string& host, const std::string& uuid) {
  Hello h;
  h.node_name = name;
  h.caps.backend = Backend::cuda;
  h.caps.nccl = true;
  h.caps.nccl_version = 22809;  // 2.28.9
  h.caps.device_uuid = uuid;
  h.caps.pci_bus_id = "0000:" + uuid.substr(uuid.size() - 2) + ":00.0";
  h.caps.host_id = host;
  return h;
}

bool mentions(const LinkChoice& c, const std::string& what) { return c.reason.find(what) != std::string::npos; }

TEST(NetLinkChoice, SameHostTwoGpusUseNccl) {
  const Hello a = gpu_worker("w0", "node-a/boot1", "GPU-aa"), b = gpu_worker("w1", "node-a/boot1", "GPU-bb");
  for (LinkMode m : {LinkMode::automatic, LinkMode::nccl}) {
    const LinkChoice c = choose_link(a, b, m);
    EXPECT_EQ(c.kind, LinkKind::nccl) << c.reason;
    EXPECT_TRUE(mentions(c, "same host")) << c.reason;
  }
}

TEST(NetLinkChoice, ForcedTcpWins) {
  const Hello a = gpu_worker("w0", "h/1", "GPU-aa"), b = gpu_worker("w1", "h/1", "GPU-bb");
  const LinkChoice c = choose_link(a, b, LinkMode::tcp);
  EXPECT_EQ(c.kind, LinkKind::tcp);
  EXPECT_TRUE(mentions(c, "--link tcp")) << c.reason;
}

TEST(NetLinkChoice, AnEndWithoutNcclMeansTcpAndIsNamed) {
  const Hello gpu = gpu_worker("w0", "h/1", "GPU-aa");
  Hello cpu;
  cpu.node_name = "cpu-box";
  cpu.caps.host_id = "h/1";
  Hello no_nccl = gpu_worker("plain-gpu", "h/1", "GPU-bb");
  no_nccl.caps.nccl = false;
  for (LinkMode m : {LinkMode::automatic, LinkMode::nccl}) {
    LinkChoice c = choose_link(gpu, cpu, m);
    EXPECT_EQ(c.kind, LinkKind::tcp);
    EXPECT_TRUE(mentions(c, "cpu-box runs on the CPU")) << c.reason;
    c = choose_link(cpu, gpu, m);
    EXPECT_EQ(c.kind, LinkKind::tcp);
    EXPECT_TRUE(mentions(c, "cpu-box")) << c.reason;
    c = choose_link(gpu, no_nccl, m);
    EXPECT_EQ(c.kind, LinkKind::tcp);
    EXPECT_TRUE(mentions(c, "plain-gpu has no NCCL")) << c.reason;
  }
}

TEST(NetLinkChoice, DifferentHostsNeedAnRdmaNetworkOnBothEnds) {
  Hello a = gpu_worker("spark-1", "spark-1/b1", "GPU-aa"), b = gpu_worker("spark-2", "spark-2/b2", "GPU-bb");
  LinkChoice c = choose_link(a, b, LinkMode::automatic);
  EXPECT_EQ(c.kind, LinkKind::tcp);
  EXPECT_TRUE(mentions(c, "different hosts")) << c.reason;
  a.caps.nccl_net = true;
  c = choose_link(a, b, LinkMode::automatic);
  EXPECT_EQ(c.kind, LinkKind::tcp);
  EXPECT_TRUE(mentions(c, "spark-2")) << c.reason;  // the end without one
  b.caps.nccl_net = true;
  c = choose_link(a, b, LinkMode::automatic);
  EXPECT_EQ(c.kind, LinkKind::nccl) << c.reason;
  EXPECT_TRUE(mentions(c, "RDMA")) << c.reason;
}

TEST(NetLinkChoice, OneGpuForBothStagesOrMismatchedVersionsOrUnknownHostMeanTcp) {
  const Hello a = gpu_worker("w0", "h/1", "GPU-aa");
  LinkChoice c = choose_link(a, gpu_worker("w1", "h/1", "GPU-aa"), LinkMode::automatic);
  EXPECT_EQ(c.kind, LinkKind::tcp);
  EXPECT_TRUE(mentions(c, "same GPU")) << c.reason;

  Hello old = gpu_worker("w1", "h/1", "GPU-bb");
  old.caps.nccl_version = 22703;
  c = choose_link(a, old, LinkMode::automatic);
  EXPECT_EQ(c.kind, LinkKind::tcp);
  EXPECT_TRUE(mentions(c, "2.28.9") && mentions(c, "2.27.3")) << c.reason;

  Hello nowhere = gpu_worker("w1", "", "GPU-bb");
  c = choose_link(a, nowhere, LinkMode::automatic);
  EXPECT_EQ(c.kind, LinkKind::tcp);
  EXPECT_TRUE(mentions(c, "which host")) << c.reason;
}

TEST(NetLinkChoice, HostileNamesArePrintableInTheReason) {
  Hello a = gpu_worker("w0", "h/1", "GPU-aa");
  Hello b;
  b.node_name = std::string("evil\n\x1b[31mname", 15);
  const LinkChoice c = choose_link(a, b, LinkMode::automatic);
  EXPECT_EQ(c.kind, LinkKind::tcp);
  EXPECT_EQ(c.reason.find('\n'), std::string::npos) << c.reason;
  EXPECT_EQ(c.reason.find('\x1b'), std::string::npos) << c.reason;
}

TEST(NetLinkChoice, ModeNamesAndHostIdentity) {
  EXPECT_EQ(link_mode_from_name("auto"), LinkMode::automatic);
  EXPECT_EQ(link_mode_from_name("tcp"), LinkMode::tcp);
  EXPECT_EQ(link_mode_from_name("nccl"), LinkMode::nccl);
  EXPECT_FALSE(link_mode_from_name("NCCL").has_value());
  EXPECT_FALSE(link_mode_from_name("").has_value());
  for (LinkMode m : {LinkMode::automatic, LinkMode::tcp, LinkMode::nccl}) {
    EXPECT_EQ(link_mode_from_name(link_mode_name(m)), m);
  }
  EXPECT_EQ(link_kind_name(LinkKind::nccl), "nccl");
  EXPECT_EQ(link_kind_name(LinkKind::tcp), "tcp");
  // Two calls in one process: the same host.
  const std::string id = local_host_id();
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(id, local_host_id());
}

TEST(NetLinkChoice, ProbingNeverStartsNcclWithMulticastOn) {
  unsetenv("NCCL_NVLS_ENABLE");
  const NcclProbe p = probe_nccl(0);
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  ASSERT_NE(nvls, nullptr);
  EXPECT_STREQ(nvls, "0");
  if (!nccl_built()) {
    EXPECT_FALSE(p.available);
    EXPECT_NE(p.why_not.find("no NCCL"), std::string::npos) << p.why_not;
    EXPECT_THROW(nccl_unique_id(), NcclLinkError);
  }
}

}  // namespace
}  // namespace baton::net
