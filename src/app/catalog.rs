//! The function catalog: every function the app serves, as the handler routes it and as its
//! `function-defs/<Name>/function.json` declares it. Tests check the two agree both ways.

/// How the Functions host reaches a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// HTTP-only function, forwarded as the raw request to `/api/{route}`
    /// (`enableForwardingHttpRequest`).
    Http {
        method: &'static str,
        route: &'static str,
    },
    /// Queue trigger on the queue named by an app setting plus `suffix` (`""`, or `"-poison"` for
    /// the queue the host moves a message to after its last failed delivery); the host POSTs
    /// `/{FunctionName}`.
    Queue {
        queue_setting: &'static str,
        suffix: &'static str,
    },
}

/// One function of the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionSpec {
    pub name: &'static str,
    pub trigger: Trigger,
}

/// App setting naming the prefix-scan step queue.
pub const PREFIX_SCAN_QUEUE_SETTING: &str = "TABLESCAN_PREFIXSCAN_QUEUE";
/// App setting naming the table-copy work queue.
pub const TABLE_COPY_QUEUE_SETTING: &str = "TABLESCAN_TABLECOPY_QUEUE";
/// The host's poison queue of a queue: `<queue>-poison`.
pub const POISON_SUFFIX: &str = "-poison";

pub const FUNCTIONS: &[FunctionSpec] = &[
    FunctionSpec {
        name: "StartScan",
        trigger: Trigger::Http {
            method: "POST",
            route: "scans",
        },
    },
    FunctionSpec {
        name: "ListScans",
        trigger: Trigger::Http {
            method: "GET",
            route: "scans",
        },
    },
    FunctionSpec {
        name: "GetScan",
        trigger: Trigger::Http {
            method: "GET",
            route: "scans/{id}",
        },
    },
    FunctionSpec {
        name: "CancelScan",
        trigger: Trigger::Http {
            method: "DELETE",
            route: "scans/{id}",
        },
    },
    FunctionSpec {
        name: "PrefixScan",
        trigger: Trigger::Queue {
            queue_setting: PREFIX_SCAN_QUEUE_SETTING,
            suffix: "",
        },
    },
    FunctionSpec {
        name: "TableCopy",
        trigger: Trigger::Queue {
            queue_setting: TABLE_COPY_QUEUE_SETTING,
            suffix: "",
        },
    },
    // A message whose every delivery failed without the handler recording it (the process was
    // killed, or storage stayed unreachable) lands in the poison queue; these record the work
    // item as failed so its scan ends instead of waiting for it forever.
    FunctionSpec {
        name: "PrefixScanPoison",
        trigger: Trigger::Queue {
            queue_setting: PREFIX_SCAN_QUEUE_SETTING,
            suffix: POISON_SUFFIX,
        },
    },
    FunctionSpec {
        name: "TableCopyPoison",
        trigger: Trigger::Queue {
            queue_setting: TABLE_COPY_QUEUE_SETTING,
            suffix: POISON_SUFFIX,
        },
    },
];
