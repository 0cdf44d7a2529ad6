"""web_demo"""
