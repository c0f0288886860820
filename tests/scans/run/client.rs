//! `tablescan scan` against the local host (filled below).
