/*
 * geoccl._C: the Python face of the process group (geoccl/torch.py
 * registers it with torch.distributed), and under torch 2.x the group
 * object torch.distributed hands out for it.
 */
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <geoccl.h>

#include "process_group.hpp"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace py = pybind11;
using geoccl_torch::ProcessGroupGeoCCL;

#if TORCH_VERSION_MAJOR >= 2
namespace {
/* torch 2.x: the process group torch.distributed hands out for a geoccl
 * group. torch makes a plain c10d::ProcessGroup for a plugin's Backend, and
 * that group names its backend by type: "custom" for every plugin, which is
 * what DDP's logging data and ProcessGroup.name() report. A plugin whose
 * creator returns a ProcessGroup has that group used as it is, so the
 * creator (geoccl/torch.py) returns this one: it names itself "geoccl" and
 * dispatches every call to the Backend it was given, for the CPU (and,
 * when compiled for it, CUDA) devices. */
class GroupGeoCCL : public ::c10d::ProcessGroup {
 public:
  GroupGeoCCL(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
              const c10::intrusive_ptr<ProcessGroupGeoCCL>& backend)
      : ::c10d::ProcessGroup(store, rank, size) {
    setDefaultBackend(BackendType::CUSTOM);
    setBackend(c10::DeviceType::CPU, BackendType::CUSTOM, backend);
#if defined(GEOCCL_TORCH_CUDA) && defined(GEOCCL_TORCH_C10_CUDA)
    setBackend(c10::DeviceType::CUDA, BackendType::CUSTOM, backend);
#endif
  }

  const std::string getBackendName() const override { return "geoccl"; }
};
}  // namespace
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "GeoCCL's torch.distributed backend (see geoccl.torch)";
  // The base class lives in torch's own module; import it so that pybind11
  // knows it before the subclass is declared.
  py::object base = py::module::import("torch._C._distributed_c10d").attr(GEOCCL_TORCH_BASE_NAME);

  py::class_<ProcessGroupGeoCCL, c10::intrusive_ptr<ProcessGroupGeoCCL>>(m, "ProcessGroupGeoCCL",
                                                                          base)
      .def(py::init<const c10::intrusive_ptr<::c10d::Store>&, int, int,
                    std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>(),
           "Forms the GeoCCL communicator of the group; collective over its ranks.")
      .def("enable_any_source", &ProcessGroupGeoCCL::enableAnySource,
           "Receives without a source rank (every rank, before any send; each send then "
           "counts itself in the group's store).")
      .def("abort", &ProcessGroupGeoCCL::abort, py::call_guard<py::gil_scoped_release>(),
           "Makes the work in progress fail and refuses later calls.")
      .def(
          "shrink",
          [](ProcessGroupGeoCCL& pg, const std::vector<int>& exclude, bool failed,
             const c10::intrusive_ptr<::c10d::Store>& store) {
            return pg.shrink(exclude, failed, store);
          },
          py::arg("exclude"), py::arg("failed"), py::arg("store") = nullptr,
          py::call_guard<py::gil_scoped_release>(),
          "The group of the ranks not in exclude, from this group's communicator "
          "(ncclCommShrink; NCCL_SHRINK_ABORT when failed, the call in flight failing "
          "first); every one of them calls it at the same point. Ends this group.")
      .def("failed_ranks", &ProcessGroupGeoCCL::failedRanks,
           py::call_guard<py::gil_scoped_release>(),
           "The dead ranks of this broken group, the same list on every survivor with "
           "GEOCCL_ELASTIC_ETCD (geocclCommGetFailedRanks; blocks on the store).")
      .def("joiners_waiting", &ProcessGroupGeoCCL::joinersWaiting,
           py::call_guard<py::gil_scoped_release>(),
           "Processes waiting in join(), as this rank last saw (geocclCommJoinersWaiting).")
      .def("leave", &ProcessGroupGeoCCL::leave, py::call_guard<py::gil_scoped_release>(),
           "This rank leaves at the next grow() (geocclCommLeave).")
      .def(
          "grow",
          [](ProcessGroupGeoCCL& pg, const c10::intrusive_ptr<::c10d::Store>& store)
              -> py::object {
            c10::intrusive_ptr<ProcessGroupGeoCCL> g;
            {
              py::gil_scoped_release nogil;
              g = pg.grow(store);
            }
            if (!g) return py::none();
            return py::cast(g);
          },
          py::arg("store") = nullptr,
          "Every rank at the same point: the group of the members that stay and the joiners "
          "(geocclCommGrow); None on a rank that leaves, and on every rank when nothing "
          "changed.")
      .def_static("join", &ProcessGroupGeoCCL::join, py::arg("store"), py::arg("timeout"),
                  py::call_guard<py::gil_scoped_release>(),
                  "A process that is not a member waits until the members grow "
                  "(geocclCommJoin); its group.")
      .def("quiesce", &ProcessGroupGeoCCL::quiesce, py::call_guard<py::gil_scoped_release>(),
           "Ends this group once its queued work has run; later calls are refused.")
      .def(
          "compression",
          [](ProcessGroupGeoCCL& pg) {
            const char* name = nullptr;
            pg.callOnWorker("geocclCommGetCompression", [&name](ncclComm_t comm) {
              return geocclCommGetCompression(comm, &name);
            });
            return std::string(name ? name : "");
          },
          py::call_guard<py::gil_scoped_release>(),
          "The codec GeoCCL uses between regions for this group's all-reduces.")
      .def(
          "set_compression",
          [](ProcessGroupGeoCCL& pg, const std::string& spec) {
            pg.callOnWorker("geocclCommSetCompression", [&spec](ncclComm_t comm) {
              return geocclCommSetCompression(comm, spec.c_str());
            });
          },
          py::arg("spec"), py::call_guard<py::gil_scoped_release>(),
          "Sets the codec between regions (the values of GEOCCL_COMPRESS), after the work "
          "queued before; every rank must set the same.")
      .def(
          "register_error_feedback",
          [](ProcessGroupGeoCCL& pg, const at::Tensor& t) {
            TORCH_CHECK(t.is_contiguous(), "register_error_feedback: the tensor must be "
                        "contiguous (a strided one is all-reduced through a copy)");
            void* h = nullptr;
            void* p = t.data_ptr();
            size_t bytes = (size_t)t.numel() * t.element_size();
            pg.callOnWorker("geocclCommRegisterErrorFeedback", [&](ncclComm_t comm) {
              return geocclCommRegisterErrorFeedback(comm, p, bytes, &h);
            });
            return (uintptr_t)h;
          },
          py::arg("tensor"), py::call_guard<py::gil_scoped_release>(),
          "Keeps error-feedback residuals for the tensor's memory (geoccl.h: "
          "geocclCommRegisterErrorFeedback); returns the handle.")
      .def(
          "deregister_error_feedback",
          [](ProcessGroupGeoCCL& pg, uintptr_t h) {
            pg.callOnWorker("geocclCommDeregisterErrorFeedback", [h](ncclComm_t comm) {
              return geocclCommDeregisterErrorFeedback(comm, (void*)h);
            });
          },
          py::arg("handle"), py::call_guard<py::gil_scoped_release>(),
          "Drops a registration and its residuals, after the work queued before.")
      .def(
          "stats",
          [](ProcessGroupGeoCCL& pg) {
            geocclStats st;
            {
              py::gil_scoped_release nogil;
              pg.callOnWorker("geocclCommGetStats",
                              [&st](ncclComm_t comm) { return geocclCommGetStats(comm, &st); });
            }
            py::dict d;
            d["bytes_intra"] = st.bytesIntra;
            d["bytes_wan"] = st.bytesWan;
            d["bytes_wan_raw"] = st.bytesWanRaw;
            d["calls_flat"] = st.callsFlat;
            d["calls_hier"] = st.callsHier;
            d["sec_codec"] = st.secCodec;
            return d;
          },
          "GeoCCL's counters of this group's communicator (geocclCommGetStats).");

#if TORCH_VERSION_MAJOR >= 2
  py::class_<GroupGeoCCL, c10::intrusive_ptr<GroupGeoCCL>>(
      m, "GroupGeoCCL", py::module::import("torch._C._distributed_c10d").attr("ProcessGroup"))
      .def(py::init<const c10::intrusive_ptr<::c10d::Store>&, int, int,
                    const c10::intrusive_ptr<ProcessGroupGeoCCL>&>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend"),
           "The process group of backend, named \"geoccl\" (torch 2.x).");
#endif

  m.def("version", [] { return std::string(geocclVersionString()); });
  m.attr("torch_api") = GEOCCL_TORCH_BASE_NAME;
#if defined(GEOCCL_TORCH_CUDA) && defined(GEOCCL_TORCH_C10_CUDA)
  m.attr("cuda") = true;  // CUDA tensors take the device path
#else
  m.attr("cuda") = false;
#endif
}
