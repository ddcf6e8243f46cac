"""kvtrace dashboard: the Streamlit entry file (``kvtrace app`` runs it).

Only navigation is declared here. Each page (``views/``) draws the shared sidebar
itself (``kvtrace.app.sidebar``) and is UI only: every figure comes from the kvtrace
functions the CLI uses. The pages are not in a ``pages/`` directory: Streamlit would
serve a deep link such as ``/curves`` from it, outside this navigation, until some
session had run this file. The pages import their helpers as :mod:`kvtrace.app`.
"""

import streamlit as st

st.set_page_config(page_title="kvtrace", page_icon=":material/memory:", layout="wide")
st.navigation(
    [
        st.Page("views/overview.py", title="Overview", icon=":material/dashboard:", default=True),
        st.Page("views/curves.py", title="Curves", icon=":material/show_chart:"),
        st.Page("views/whatifs.py", title="What-ifs", icon=":material/compare_arrows:"),
        st.Page("views/sizing.py", title="Sizing", icon=":material/shopping_cart:"),
        st.Page("views/scenarios.py", title="Scenarios", icon=":material/science:"),
    ]
).run()
