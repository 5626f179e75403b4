//! The openb default trace, embedded so `egpu simulate` works out of the
//! box (CC BY 4.0, Alibaba clusterdata; see `data/openb/README.md`).

/// The node list `openb_node_list_gpu_node.csv`.
pub const OPENB_NODES: &str = include_str!("../../../data/openb/openb_node_list_gpu_node.csv");
/// The pod list `openb_pod_list_default.csv`.
pub const OPENB_DEFAULT_PODS: &str = include_str!("../../../data/openb/openb_pod_list_default.csv");
/// Attribution printed in reports made from the embedded trace.
pub const ATTRIBUTION: &str = "openb trace: Alibaba clusterdata (Weng et al., USENIX ATC'23), CC BY 4.0";
