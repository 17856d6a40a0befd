// A worker as one rank of a tensor-parallel group (docs/TENSOR_PARALLEL.md,
// "Groups across workers"): the rank file it must hold, the all-reduce mesh
// it forms with the other ranks after loading, and rank 0's links that pass
// every FORWARD and FREE_SEQ to ranks 1.. so that all ranks run the same rows.

// First: it includes <utility> ahead of Asio (see there).
#include "net/address.h"
// clang-format off
#include <boost/asio/ip/tcp.hpp>
// clang-format on

#include <string>

#include "net/log.h"
#include "worker/worker_impl.h"

namespace baton::worker_impl {

net::TcpAllReduce& GroupComm::mesh() const {
  if (!mesh_) throw std::runtime_error("the tensor-parallel group is not formed (a rank is being replaced)");
  return *mesh_;
}

// The mesh's port is chosen once, at start, so that HELLO can say it: a
// free port of the bind address, taken again by each mesh this worker forms
// (the listener is open only while a mesh forms). Between meshes the port
// stays reserved by a socket bound to it with SO_REUSEADDR and never
// listening: the kernel then gives it to no other bind and no outgoing
// connection of any process, while the mesh's own listener (SO_REUSEADDR
// too) may still take it. Probing a port and closing the probe left it free
// for anyone, and an outgoing connection that took it made the mesh fail.
void Worker::choose_mesh_address(const std::string& bind_host, const std::string& advertised_host) {
  mesh_bind_host_ = bind_host;
  mesh_port_ = opt_.mesh_port;
  if (mesh_port_ == 0) {
    using boost::asio::ip::tcp;
    const tcp::endpoint any(net::resolve_host(bind_host), 0);
    mesh_port_reservation_.open(any.protocol());
    mesh_port_reservation_.set_option(tcp::socket::reuse_address(true));
    mesh_port_reservation_.bind(any);
    mesh_port_ = mesh_port_reservation_.local_endpoint().port();
  }
  mesh_address_ = net::join_host_port(advertised_host, mesh_port_);
}

bool Worker::check_group_file(const net::Assign& a) {
  const net::ModelIdentity have = model_identity(*file_);
  const uint32_t rank = have.parts.empty() ? 0 : have.parts[0].tp_rank;
  const uint32_t size = have.parts.empty() ? 1 : have.parts[0].tp_size;
  if (rank == a.tp_rank && size == a.tp_size) return true;
  const std::string held = size == 1 ? "a whole model or pipeline part"
                                     : "rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (a.tp_size == 1) {
    fail(net::WireError::model_mismatch, "the model file is tensor-parallel " + held +
                                             " (baton split --tp), but stage " + std::to_string(a.stage_index) +
                                             " is not a tensor-parallel group");
  } else {
    fail(net::WireError::model_mismatch,
         "stage " + std::to_string(a.stage_index) + " is a tensor-parallel group of " + std::to_string(a.tp_size) +
             " ranks and this worker is rank " + std::to_string(a.tp_rank) + ": it needs that rank's file (baton split --tp " +
             std::to_string(a.tp_size) + "), not " + held);
  }
  return false;
}

bool Worker::form_group(const net::Assign& a) {
  for (auto& c : group_links_) c->close("the tensor-parallel group is re-formed");
  group_links_.clear();
  group_comm_.set(nullptr);
  if (a.tp_size <= 1) return true;
  try {
    net::AllReduceConfig c;
    c.rank = int(a.tp_rank);
    c.size = int(a.tp_size);
    c.bind_host = mesh_bind_host_;
    c.port = mesh_port_;
    c.secret = secret_;
    c.setup_timeout = kMeshSetupTimeout;
    c.name = opt_.name;
    auto mesh = std::make_unique<net::TcpAllReduce>(c);
    mesh->connect(a.tp_mesh);
    group_comm_.set(std::move(mesh));
    // Rank 0 is the group's face: the previous stage (or the coordinator)
    // sends to it alone, and it passes each message on to the others.
    for (uint32_t r = 1; a.tp_rank == 0 && r < a.tp_size; ++r) {
      auto link = connect_blocking(io_, a.tp_peers[r], peer_hello(), secret_, "rank " + std::to_string(r) + " of the group");
      link->start([](net::Message&&) {},
                  [name = opt_.name, r](std::error_code, const std::string& reason) {
                    net::log(net::LogLevel::info, name + ": the link to rank " + std::to_string(r) + " closed: " + reason);
                  });
      group_links_.push_back(std::move(link));
    }
  } catch (const std::exception& e) {
    // Not a configuration error: the worker registers afresh (or, in a
    // local cluster, exits to be started again) and the group heals.
    send_error(net::WireError::load_failed, 0, std::string("cannot form the tensor-parallel group: ") + e.what());
    stop(1, std::string("the tensor-parallel group did not form: ") + e.what());
    return false;
  }
  net::log(net::LogLevel::info, opt_.name + ": rank " + std::to_string(a.tp_rank) + " of " +
                                    std::to_string(a.tp_size) + " of stage " + std::to_string(a.stage_index) +
                                    ": the all-reduce mesh is up");
  return true;
}

// ASSIGN of the stage this worker has loaded: a rank of its group was
// replaced. The stage stays; the KV goes (the new rank holds none, and every
// rank must hold the same positions) and the mesh is formed anew.
bool Worker::regroup(const net::Assign& a) {
  if (a.stage_index != assign_.stage_index || a.layer_first != assign_.layer_first ||
      a.layer_last != assign_.layer_last || a.has_embedding != assign_.has_embedding ||
      a.has_output != assign_.has_output || a.tp_size != assign_.tp_size || a.tp_rank != assign_.tp_rank ||
      a.tp_size <= 1) {
    return false;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < stage_->config().n_seq; ++s) stage_->reset(s);
  samplers_.clear();
  const std::string next = assign_.next_peer;
  const net::LinkKind kind = next_kind_;
  assign_ = a;
  assign_.next_peer = next;
  if (!form_group(a)) return true;
  if (a.next_peer != next || a.next_link != kind) connect_next(a.next_peer, a.next_link);
  coord_->send(ready_message(t0));
  return true;
}

void Worker::pass_to_group(const net::Message& m) {
  // A rank whose link is gone fails the next sum, which names it; nothing
  // to do here.
  for (auto& link : group_links_) link->send(m);
}

}  // namespace baton::worker_impl
