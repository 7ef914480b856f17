//! Fake-driven failure tests of the rebuilding steps.
