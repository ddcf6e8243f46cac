"""The dashboard's pages (each run by Streamlit as a script from :mod:`kvtrace.app`'s navigation)."""
