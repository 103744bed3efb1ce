//! genesis (in progress)
