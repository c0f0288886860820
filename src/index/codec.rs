//! Little-endian encoding shared by the segment and staging files: fixed-size integers,
//! length-prefixed UTF-8 strings, and a checked reader that never reads past its input.

use super::FormatError;

/// Longest key string a file may hold, in UTF-8 bytes (a key is at most 512 UTF-16 units,
/// so at most 1,536 UTF-8 bytes).
pub const MAX_KEY_BYTES: usize = 4096;

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A `u32` byte length, then the UTF-8 bytes.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) -> Result<(), FormatError> {
    if s.len() > MAX_KEY_BYTES {
        return Err(FormatError::new(format!(
            "a key of {} bytes is over the {MAX_KEY_BYTES} a file holds",
            s.len()
        )));
    }
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Reads `bytes` front to back; every read checks the length left.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, at: 0, what }
    }

    pub fn position(&self) -> usize {
        self.at
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(FormatError::new(format!(
                "the {} ends at byte {} where {n} more bytes were expected at {}",
                self.what,
                self.bytes.len(),
                self.at
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    pub fn string(&mut self) -> Result<String, FormatError> {
        self.str_ref().map(str::to_string)
    }

    /// A length-prefixed UTF-8 key, borrowed.
    pub fn str_ref(&mut self) -> Result<&'a str, FormatError> {
        let len = self.u32()? as usize;
        if len > MAX_KEY_BYTES {
            return Err(FormatError::new(format!(
                "the {} has a key of {len} bytes, over the {MAX_KEY_BYTES} allowed",
                self.what
            )));
        }
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map_err(|_| FormatError::new(format!("the {} has a key that is not UTF-8", self.what)))
    }
}

/// Checks magic, version (one of `versions`) and hash id at the front of a file; returns the
/// version.
pub(crate) fn check_preamble(
    reader: &mut Reader<'_>,
    magic: &[u8; 8],
    versions: &[u16],
) -> Result<u16, FormatError> {
    let what = reader.what;
    if reader.take(8)? != magic {
        return Err(FormatError::new(format!(
            "not an index {what} (its first 8 bytes are not {:?})",
            String::from_utf8_lossy(magic)
        )));
    }
    let found = reader.u16()?;
    if !versions.contains(&found) {
        let known: Vec<String> = versions.iter().map(u16::to_string).collect();
        return Err(FormatError::new(format!(
            "index {what} version {found}: this build reads version {}",
            known.join(" and ")
        )));
    }
    let hash = reader.u16()?;
    if hash != super::hash::HASH_ID {
        return Err(FormatError::new(format!(
            "index {what} hash id {hash}: this build knows hash id {}",
            super::hash::HASH_ID
        )));
    }
    Ok(found)
}
