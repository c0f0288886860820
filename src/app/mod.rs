//! The function app (filled in by the function-app work).
