from ..lanes import lane_marker

pytest_collection_modifyitems = lane_marker(__file__)
