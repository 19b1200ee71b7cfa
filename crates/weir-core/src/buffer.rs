//! A fixed-capacity byte buffer with a read cursor: the unit of all socket I/O on the
//! request path. It never grows, so every connection's memory is bounded.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

pub struct Buffer {
    data: Box<[u8]>,
    start: usize,
    end: usize,
    /// Bytes ever read into this buffer (for byte counters).
    total_read: u64,
}

impl Buffer {
    pub fn new(capacity: usize) -> Buffer {
        Buffer {
            data: vec![0; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
            total_read: 0,
        }
    }

    /// Bytes read and not yet consumed.
    #[inline]
    pub fn filled(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    #[inline]
    pub fn filled_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.start..self.end]
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Bytes read so far that have been consumed (read but no longer waiting in the buffer).
    pub fn consumed_total(&self) -> u64 {
        self.total_read - self.len() as u64
    }

    pub fn is_full(&self) -> bool {
        self.start == 0 && self.end == self.data.len()
    }

    /// Marks `n` filled bytes as used.
    #[inline]
    pub fn consume(&mut self, n: usize) {
        self.start += n.min(self.len());
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    /// The free space after the filled bytes, moving unread bytes to the front first when
    /// the tail is full. Empty only when the buffer is full.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        if self.end == self.data.len() && self.start > 0 {
            self.data.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.data[self.end..]
    }

    /// Marks `n` bytes written into [`Buffer::spare_mut`] as filled.
    pub fn commit(&mut self, n: usize) {
        let n = n.min(self.data.len() - self.end);
        self.end += n;
        self.total_read += n as u64;
    }

    /// Takes the storage out (for an idle connection to hand back to its worker), leaving
    /// an empty buffer without storage that keeps the byte count. Only call it when
    /// nothing is buffered.
    pub fn lend(&mut self) -> Buffer {
        debug_assert!(self.is_empty());
        let storage = std::mem::take(&mut self.data);
        Buffer {
            data: storage,
            start: 0,
            end: 0,
            total_read: 0,
        }
    }

    /// Puts storage back into a buffer emptied by [`Buffer::lend`].
    pub fn restore(&mut self, storage: Buffer) {
        debug_assert!(self.data.is_empty());
        self.data = storage.data;
        self.start = 0;
        self.end = 0;
    }

    /// Reads once from `src` into the free space (moving unread bytes to the front first
    /// when the tail is full). Returns 0 at EOF, or when the buffer is full.
    pub async fn read_from<R: AsyncRead + Unpin>(&mut self, src: &mut R) -> io::Result<usize> {
        let spare = self.spare_mut();
        if spare.is_empty() {
            return Ok(0);
        }
        let n = src.read(spare).await?;
        self.commit(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_compacts_and_consumes() {
        let mut buf = Buffer::new(8);
        let mut src: &[u8] = b"abcdefghij";
        assert_eq!(buf.read_from(&mut src).await.unwrap(), 8);
        assert!(buf.is_full());
        assert_eq!(buf.read_from(&mut src).await.unwrap(), 0);
        buf.consume(6);
        assert_eq!(buf.filled(), b"gh");
        assert_eq!(buf.read_from(&mut src).await.unwrap(), 2);
        assert_eq!(buf.filled(), b"ghij");
        buf.consume(10);
        assert!(buf.is_empty());
        assert_eq!(buf.read_from(&mut src).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn lending_keeps_the_byte_count() {
        let mut buf = Buffer::new(8);
        let mut src: &[u8] = b"abcdef";
        buf.read_from(&mut src).await.unwrap();
        buf.consume(6);
        let storage = buf.lend();
        assert_eq!((buf.capacity(), storage.capacity()), (0, 8));
        assert_eq!(
            buf.read_from(&mut src).await.unwrap(),
            0,
            "no storage: nothing read"
        );
        buf.restore(storage);
        let mut src: &[u8] = b"gh";
        assert_eq!(buf.read_from(&mut src).await.unwrap(), 2);
        assert_eq!((buf.filled(), buf.consumed_total()), (&b"gh"[..], 6));
    }
}
